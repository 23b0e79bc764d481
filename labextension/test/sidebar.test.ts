import { Widget } from '@lumino/widgets';
import { afterEach, describe, expect, it } from 'vitest';

import { KernelChannel } from '../src/channel';
import { SidebarModel } from '../src/model';
import { GpuMemSidebar } from '../src/sidebar';
import { barSegments, renderDevice, renderTimeline } from '../src/view';
import {
  device,
  flush,
  holder,
  MiB,
  purgeResult,
  RecordingSession,
  snapshot
} from './helpers';

const widgets: Widget[] = [];

afterEach(() => {
  while (widgets.length) {
    widgets.pop()!.dispose();
  }
});

function setUp(answer = true) {
  const model = new SidebarModel();
  const channel = new KernelChannel(model);
  const asked: [string[], number][] = [];
  const sidebar = new GpuMemSidebar({
    model,
    channel,
    confirmPurge: async (names, bytes) => {
      asked.push([names, bytes]);
      return answer;
    }
  });
  Widget.attach(sidebar, document.body);
  widgets.push(sidebar);
  const session = new RecordingSession();
  channel.follow(session, 'demo.ipynb');
  const comm = () => session.kernel.lastComm;
  return { model, channel, sidebar, session, comm, asked };
}

function ready(ctx: ReturnType<typeof setUp>, snap = snapshot()) {
  ctx.comm().receive({ type: 'hello', version: '0.1.0', device: 'auto' });
  ctx.comm().receive({ type: 'snapshot', snapshot: snap });
  ctx.comm().sent = [];
}

const $ = (root: HTMLElement, sel: string) => root.querySelector(sel) as HTMLElement;
const $$ = (root: HTMLElement, sel: string) =>
  Array.from(root.querySelectorAll(sel)) as HTMLElement[];

describe('device bars', () => {
  it('has the five segments of the protocol, in order', () => {
    const segments = barSegments(
      device({ allocated: 2, reserved: 5, non_framework: 7, other_processes: 11, free: 13 })
    );
    expect(segments.map(s => [s.key, s.bytes])).toEqual([
      ['allocated', 2],
      ['reserved-free', 3],
      ['non-framework', 7],
      ['other', 11],
      ['free', 13]
    ]);
  });

  it('sizes segments as shares of the device total and labels them', () => {
    const node = renderDevice(
      device({
        id: 'cuda:0',
        kind: 'cuda',
        name: 'NVIDIA H200',
        total: 100 * MiB,
        allocated: 25 * MiB,
        reserved: 50 * MiB,
        non_framework: 10 * MiB,
        other_processes: null,
        free: 15 * MiB
      })
    );
    const widths = $$(node, '.jp-GpuMem-seg').map(s => [s.className.split('seg-')[1], s.style.width]);
    expect(widths).toEqual([
      ['allocated', '25.00%'],
      ['reserved-free', '25.00%'],
      ['non-framework', '10.00%'],
      ['free', '15.00%']
    ]);
    expect(node.textContent).toContain('cuda:0 NVIDIA H200');
    expect($(node, '.jp-GpuMem-bar').getAttribute('aria-label')).toContain('other processes 0 B');
  });

  it('draws one chart per device from the timeline', () => {
    const node = renderTimeline(
      new Map([
        [
          'cuda:0',
          [
            { time: 1, allocated: 0, reserved: 0, used: 10 * MiB },
            { time: 2, allocated: 4 * MiB, reserved: 8 * MiB, used: 20 * MiB }
          ]
        ],
        [
          'cpu',
          [
            { time: 1, allocated: null, reserved: null, used: 5 * MiB },
            { time: 3, allocated: null, reserved: null, used: 10 * MiB }
          ]
        ]
      ]),
      10
    );
    const boxes = $$(node, '.jp-GpuMem-chartBox');
    expect(boxes.map(b => b.dataset.device)).toEqual(['cuda:0', 'cpu']);
    const lines = $$(boxes[0], 'polyline');
    expect(lines.map(l => l.getAttribute('class'))).toEqual([
      'jp-GpuMem-line jp-GpuMem-line-allocated',
      'jp-GpuMem-line jp-GpuMem-line-reserved',
      'jp-GpuMem-line jp-GpuMem-line-process'
    ]);
    // newest reading at the right edge; zero at the bottom; the peak below the top
    expect(lines[0].getAttribute('points')).toBe('8,40.00 9,32.73');
    expect(lines[2].getAttribute('points')).toBe('8,21.82 9,3.64');
    expect(boxes[0].textContent).toContain('allocated 4.0 MiB, reserved 8.0 MiB, process 20.0 MiB');
    // a series without any value is left out
    expect($$(boxes[1], 'polyline').map(l => l.getAttribute('class'))).toEqual([
      'jp-GpuMem-line jp-GpuMem-line-process'
    ]);
    expect(boxes[1].textContent).toContain('cpu, last 2 s: process 10.0 MiB');
  });
});

describe('GpuMemSidebar', () => {
  it('says when no notebook is in focus', () => {
    const model = new SidebarModel();
    const sidebar = new GpuMemSidebar({
      model,
      channel: new KernelChannel(model),
      confirmPurge: async () => false
    });
    widgets.push(sidebar);
    expect(sidebar.node.textContent).toContain('No notebook in focus');
    expect(sidebar.node.textContent).toContain('Open a notebook');
  });

  it('offers a load button when the kernel has not loaded the extension', async () => {
    const ctx = setUp();
    ctx.comm().closeFromKernel();
    const button = $(ctx.sidebar.node, '.jp-GpuMem-load') as HTMLButtonElement;
    expect(button.textContent).toBe('Load jupyter_gpumem');
    expect(ctx.session.kernel.executed).toEqual([]);
    button.click();
    await flush();
    expect(ctx.session.kernel.executed.map(e => e.code)).toEqual(['%load_ext jupyter_gpumem']);
    expect(ctx.session.kernel.comms.length).toBe(2);
  });

  it('lists holders with their sizes and a checkbox each', () => {
    const ctx = setUp();
    ready(
      ctx,
      snapshot({
        holders: [
          holder(),
          holder({
            name: 'Out[3]',
            label: 'Out[3]',
            hidden: true,
            unique: MiB,
            purge: 'Out[3]',
            hint: 'end the line with ;'
          }),
          holder({ name: 'last traceback', label: 'last traceback (f(): t)', purge: null, unique: 512 })
        ]
      })
    );
    const rows = $$(ctx.sidebar.node, 'tr.jp-GpuMem-holder');
    expect(rows.map(r => r.dataset.name)).toEqual(['big', 'Out[3]', 'last traceback']);
    expect(rows.map(r => $(r, '.jp-GpuMem-bytes').textContent)).toEqual([
      '4.0 MiB',
      '1.0 MiB',
      '512 B'
    ]);
    expect(rows[1].classList.contains('jp-GpuMem-hidden')).toBe(true);
    expect(($(rows[2], 'input') as HTMLInputElement).disabled).toBe(true);
    expect(ctx.sidebar.node.textContent).toContain('end the line with ;');
  });

  it('purges the checked names after confirmation, with the expected bytes', async () => {
    const ctx = setUp(true);
    ready(ctx);
    const purge = $(ctx.sidebar.node, '.jp-GpuMem-purge') as HTMLButtonElement;
    expect(purge.disabled).toBe(true);
    const box = $(ctx.sidebar.node, 'tr[data-name="big"] input') as HTMLInputElement;
    box.checked = true;
    box.dispatchEvent(new Event('change'));
    expect(ctx.model.selected.has('big')).toBe(true);
    expect(purge.disabled).toBe(false);
    expect(purge.textContent).toBe('Purge selected (1)');
    purge.click();
    await flush();
    expect(ctx.asked).toEqual([[['big'], 4 * MiB]]);
    expect(ctx.comm().sent).toEqual([{ type: 'purge', id: 2, names: ['big'], dry_run: false }]);

    ctx.comm().receive({ type: 'purge_result', result: purgeResult(), reply_to: 2 });
    ctx.comm().receive({ type: 'snapshot', snapshot: snapshot({ holders: [] }) });
    expect(ctx.sidebar.node.textContent).toContain('Purged big: freed cpu 4.0 MiB.');
    expect($$(ctx.sidebar.node, 'tr.jp-GpuMem-holder')).toEqual([]);
    expect(ctx.sidebar.node.textContent).toContain('No name holds memory on "cpu"');
  });

  it('sends nothing when the purge is cancelled', async () => {
    const ctx = setUp(false);
    ready(ctx);
    ctx.model.toggle('big', true);
    await ctx.sidebar.purgeSelected();
    expect(ctx.asked.length).toBe(1);
    expect(ctx.comm().sent).toEqual([]);
    expect(ctx.model.selected.has('big')).toBe(true);
  });

  it('says when there is no accelerator and switches to cpu on request', () => {
    const ctx = setUp();
    ctx.comm().receive({ type: 'hello', version: '0.1.0', device: 'auto' });
    ctx.comm().receive({
      type: 'snapshot',
      snapshot: snapshot({ device: 'auto', devices: [], holders: [], accelerator: false })
    });
    ctx.comm().sent = [];
    expect(ctx.sidebar.node.textContent).toContain('No accelerator in this kernel.');
    ($(ctx.sidebar.node, '.jp-GpuMem-useCpu') as HTMLButtonElement).click();
    expect(ctx.comm().sent).toEqual([{ type: 'set_device', id: 2, device: 'cpu' }]);
    const select = $(ctx.sidebar.node, 'select') as HTMLSelectElement;
    expect(select.value).toBe('cpu');
  });

  it('changes device from the menu, which lists devices seen', () => {
    const ctx = setUp();
    ready(ctx);
    ctx.comm().receive({
      type: 'devices',
      time: 2000,
      devices: [device({ id: 'cuda:0', kind: 'cuda' }), device({ id: 'cuda:1', kind: 'cuda' })]
    });
    const select = $(ctx.sidebar.node, 'select') as HTMLSelectElement;
    expect(Array.from(select.options).map(o => o.value)).toEqual([
      'auto',
      'all',
      'cpu',
      'cuda:0',
      'cuda:1'
    ]);
    select.value = 'cuda:1';
    select.dispatchEvent(new Event('change'));
    expect(ctx.comm().sent).toEqual([{ type: 'set_device', id: 2, device: 'cuda:1' }]);
  });

  it('shows the kernel error line', () => {
    const ctx = setUp();
    ready(ctx);
    ctx.comm().receive({ type: 'error', message: "no name 'x' (nothing was deleted)" });
    expect($(ctx.sidebar.node, '.jp-GpuMem-error').textContent).toBe(
      "no name 'x' (nothing was deleted)"
    );
  });

  it('keeps the holders table (and its checkboxes) across device readings', () => {
    const ctx = setUp();
    ready(ctx);
    const table = $(ctx.sidebar.node, 'table');
    ctx.comm().receive({ type: 'devices', time: 2000, devices: [device()] });
    expect($(ctx.sidebar.node, 'table')).toBe(table);
    expect($$(ctx.sidebar.node, '.jp-GpuMem-chartBox').length).toBe(1);
  });

  it('keeps its buttons across device readings (a click is not lost)', () => {
    const ctx = setUp();
    ctx.comm().receive({ type: 'hello', version: '0.1.0', device: 'auto' });
    ctx.comm().receive({
      type: 'snapshot',
      snapshot: snapshot({ device: 'auto', devices: [], holders: [], accelerator: false })
    });
    const button = $(ctx.sidebar.node, '.jp-GpuMem-useCpu');
    ctx.comm().receive({ type: 'devices', time: 2000, devices: [device()] });
    expect($(ctx.sidebar.node, '.jp-GpuMem-useCpu')).toBe(button);
  });

  it('renders only when shown, then catches up', () => {
    const ctx = setUp();
    ready(ctx);
    ctx.sidebar.hide();
    ctx.comm().receive({ type: 'snapshot', snapshot: snapshot({ holders: [holder({ name: 'later', purge: 'later' })] }) });
    expect($(ctx.sidebar.node, 'tr[data-name="later"]')).toBeNull();
    ctx.sidebar.show();
    expect($(ctx.sidebar.node, 'tr[data-name="later"]')).not.toBeNull();
  });

  it('refreshes through its poll while visible', async () => {
    const model = new SidebarModel();
    const channel = new KernelChannel(model);
    const sidebar = new GpuMemSidebar({
      model,
      channel,
      confirmPurge: async () => false,
      refreshInterval: 20
    });
    Widget.attach(sidebar, document.body);
    widgets.push(sidebar);
    const session = new RecordingSession();
    channel.follow(session, 'demo.ipynb');
    session.kernel.lastComm.receive({ type: 'hello', version: '0.1.0', device: 'auto' });
    session.kernel.lastComm.sent = [];
    await new Promise(resolve => setTimeout(resolve, 150));
    const refreshes = session.kernel.lastComm.sent.filter(m => m.type === 'refresh');
    expect(refreshes.length).toBeGreaterThanOrEqual(2);
    sidebar.hide();
    session.kernel.lastComm.sent = [];
    await new Promise(resolve => setTimeout(resolve, 100));
    expect(session.kernel.lastComm.sent).toEqual([]);
  });
});
