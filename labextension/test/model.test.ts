import { describe, expect, it } from 'vitest';

import { TIMELINE_POINTS } from '../src/constants';
import { SidebarModel } from '../src/model';
import { device, holder, MiB, purgeResult, snapshot } from './helpers';

describe('SidebarModel', () => {
  it('goes ready on hello and keeps the version', () => {
    const model = new SidebarModel();
    model.reset('connecting', 'a.ipynb');
    model.handle({ type: 'hello', version: '0.1.0', device: 'auto' });
    expect(model.state).toBe('ready');
    expect(model.version).toBe('0.1.0');
    expect(model.kernelLabel).toBe('a.ipynb');
  });

  it('emits changed on every message', () => {
    const model = new SidebarModel();
    let count = 0;
    model.changed.connect(() => (count += 1));
    model.handle({ type: 'devices', time: 1, devices: [device()] });
    model.handle({ type: 'error', message: 'x' });
    expect(count).toBe(2);
  });

  it('keeps a bounded timeline per device, one point per reading time', () => {
    const model = new SidebarModel();
    for (let t = 0; t < TIMELINE_POINTS + 30; t++) {
      model.handle({
        type: 'devices',
        time: t,
        devices: [device({ allocated: t })]
      });
    }
    model.handle({
      type: 'devices',
      time: 5,
      devices: [device({ allocated: -1 })]
    });
    const points = model.timeline.get('cpu')!;
    expect(points.length).toBe(TIMELINE_POINTS);
    expect(points[0].time).toBe(30);
    expect(points[points.length - 1].allocated).toBe(TIMELINE_POINTS + 29);
  });

  it('checks only purgeable holders and drops checks of holders gone', () => {
    const model = new SidebarModel();
    model.handle({
      type: 'snapshot',
      snapshot: snapshot({
        holders: [holder(), holder({ name: 'last traceback', purge: null })]
      })
    });
    model.toggle('big', true);
    model.toggle('last traceback', true);
    model.toggle('nosuch', true);
    expect([...model.selected]).toEqual(['big']);
    model.handle({ type: 'snapshot', snapshot: snapshot({ holders: [] }) });
    expect(model.selected.size).toBe(0);
  });

  it('clears the selection after a purge result and keeps the result', () => {
    const model = new SidebarModel();
    model.handle({ type: 'snapshot', snapshot: snapshot() });
    model.toggle('big', true);
    model.handle({ type: 'purge_result', result: purgeResult() });
    expect(model.selected.size).toBe(0);
    expect(model.lastPurge?.freed).toEqual({ cpu: 4 * MiB });
  });

  it('says when the kernel has no accelerator', () => {
    const model = new SidebarModel();
    expect(model.noAccelerator).toBe(false);
    model.handle({ type: 'devices', time: 1, devices: [device()] });
    expect(model.noAccelerator).toBe(true);
    model.handle({
      type: 'devices',
      time: 2,
      devices: [device({ id: 'cuda:0', kind: 'cuda' })]
    });
    expect(model.noAccelerator).toBe(false);
    model.handle({
      type: 'snapshot',
      snapshot: snapshot({ accelerator: false })
    });
    expect(model.noAccelerator).toBe(true);
  });

  it('forgets a restarted kernel but keeps its timeline and the device choice', () => {
    const model = new SidebarModel();
    model.setDevice('cpu');
    model.handle({ type: 'snapshot', snapshot: snapshot() });
    model.reset('restarting', 'b.ipynb');
    expect(model.snapshot).toBeNull();
    expect(model.timeline.get('cpu')!.length).toBe(1);
    expect(model.device).toBe('cpu');
    expect(model.seenDevices).toContain('cpu');
  });
});
