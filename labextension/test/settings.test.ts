import { Widget } from '@lumino/widgets';
import { afterEach, describe, expect, it } from 'vitest';

import { KernelChannel } from '../src/channel';
import { SidebarModel } from '../src/model';
import { applySettings, readSettings } from '../src/settings';
import { GpuMemSidebar } from '../src/sidebar';
import { RecordingSession } from './helpers';
import schema from '../schema/sidebar.json';

const widgets: Widget[] = [];

afterEach(() => {
  while (widgets.length) {
    widgets.pop()!.dispose();
  }
});

describe('settings', () => {
  it('has a schema whose defaults are the built-in ones', () => {
    expect(schema.properties.refreshInterval.default).toBe(15);
    expect(schema.properties.defaultDevice.default).toBe('auto');
    expect(readSettings({})).toEqual({
      refreshInterval: 15,
      defaultDevice: 'auto'
    });
    expect(readSettings({ refreshInterval: 0, defaultDevice: ' ' })).toEqual({
      refreshInterval: 15,
      defaultDevice: 'auto'
    });
    const pattern = new RegExp(schema.properties.defaultDevice.pattern);
    for (const ok of ['auto', 'all', 'cpu', 'cuda', 'cuda:1', 'mps']) {
      expect(pattern.test(ok)).toBe(true);
    }
    expect(pattern.test('rm -rf')).toBe(false);
  });

  it('applies the refresh interval and the default device live', () => {
    const model = new SidebarModel();
    const channel = new KernelChannel(model);
    const sidebar = new GpuMemSidebar({
      model,
      channel,
      confirmPurge: async () => false
    });
    widgets.push(sidebar);
    const session = new RecordingSession();
    channel.follow(session, 'demo.ipynb');
    session.kernel.lastComm.receive({
      type: 'hello',
      version: '0.1.0',
      device: 'auto'
    });
    session.kernel.lastComm.sent = [];

    applySettings(
      { refreshInterval: 3, defaultDevice: 'cpu' },
      sidebar,
      channel
    );
    expect(sidebar.poll.frequency.interval).toBe(3000);
    expect(model.device).toBe('cpu');
    expect(session.kernel.lastComm.sent).toEqual([
      { type: 'set_device', id: 2, device: 'cpu' }
    ]);

    // the user picks another device; a change of the interval alone keeps it
    channel.setDevice('all');
    applySettings(
      { refreshInterval: 5, defaultDevice: 'cpu' },
      sidebar,
      channel
    );
    expect(sidebar.poll.frequency.interval).toBe(5000);
    expect(model.device).toBe('all');
  });
});
