import { afterEach, describe, expect, it, vi } from 'vitest';

import { ITimelinePoint } from '../src/kernelView';
import {
  axisBytes,
  timelineData,
  byteTicks,
  timeTicks,
  TIME_STEPS,
  TimelineView,
  timeRange,
  visibleBands
} from '../src/timeline';
import { h, renderCodeText } from '../src/dom';
import { formatSeconds } from '../src/format';
import { barScale, barSegments, renderDevice } from '../src/viewDevices';
import { renderHolderNotes } from '../src/viewHolderNotes';
import { HoldersTable } from '../src/holders';
import {
  $,
  $$,
  device,
  disposeSidebars,
  expectProcessScale,
  flush,
  hello,
  holder,
  MiB,
  openSidebar,
  purgeResult,
  ready,
  segmentWidths,
  SidebarCase,
  snapshot
} from './helpers';

afterEach(disposeSidebars);

const setUp = (answer = true) => openSidebar({ answer });

/** A sidebar set to cuda:0 on a kernel that has no such device. */
function withoutCuda0(): SidebarCase {
  const ctx = setUp();
  ctx.channel.setDevice('cuda:0');
  ready(
    ctx,
    snapshot({
      device: 'cuda:0',
      devices: [],
      holders: [],
      accelerator: false
    }),
    'cuda:0'
  );
  return ctx;
}

/** The kernel answers purge request `id` with the sample result. */
function purged(ctx: SidebarCase, id: number): void {
  ctx
    .comm()
    .receive({ type: 'purge_result', result: purgeResult(), reply_to: id });
}

/** The kernel sends a snapshot in which no name holds memory. */
function emptied(ctx: SidebarCase): void {
  ctx.comm().receive({ type: 'snapshot', snapshot: snapshot({ holders: [] }) });
}

describe('device bars', () => {
  it('has the five segments of the protocol, in order', () => {
    const segments = barSegments(
      device({
        allocated: 2,
        reserved: 5,
        non_framework: 7,
        other_processes: 11,
        free: 13
      })
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
    const widths = segmentWidths(node);
    expect(widths).toEqual([
      ['allocated', '25.00%'],
      ['reserved-free', '25.00%'],
      ['non-framework', '10.00%'],
      ['free', '15.00%']
    ]);
    expect(node.textContent).toContain('cuda:0 NVIDIA H200');
    expect($(node, '.jp-GpuMem-bar').getAttribute('aria-label')).toContain(
      'other processes 0 B'
    );
  });

  it("draws a host's bar at the scale of this process: tracked tensors and the rest", () => {
    const host = device({
      name: 'host memory',
      allocated: null,
      reserved: null,
      non_framework: null,
      frameworks: [],
      total: 24000 * MiB,
      used_all: 2000 * MiB,
      used_process: 400 * MiB,
      other_processes: null,
      free: 22000 * MiB,
      attributed: 100 * MiB
    });
    const { segments, whole } = barScale(host);
    expect(whole).toBe(400 * MiB);
    expect(segments.map(s => [s.label, s.bytes])).toEqual([
      ['tracked tensors', 100 * MiB],
      ['rest of the process', 300 * MiB]
    ]);
    const node = renderDevice(host);
    expectProcessScale(
      node,
      '25.00%',
      '75.00%',
      'tracked tensors 100.0 MiB, process 400.0 MiB'
    );
    expect(node.textContent).toContain('host 23.4 GiB, 21.5 GiB free');
    // the other processes are what all use beyond this one
    expect(barSegments(host).find(s => s.key === 'other')?.bytes).toBe(
      1600 * MiB
    );
  });
});

describe('timelines', () => {
  const gpu: ITimelinePoint[] = [
    { time: 1, allocated: 0, reserved: 0, used: 10 * MiB },
    { time: 2, allocated: 4 * MiB, reserved: 8 * MiB, used: 20 * MiB },
    { time: 30, allocated: 2 * MiB, reserved: 8 * MiB, used: 20 * MiB }
  ];

  it('aligns the series with a value, and breaks the line where readings stopped', () => {
    const { specs, data } = timelineData(gpu);
    expect(specs.map(s => s.key)).toEqual(['allocated', 'reserved', 'process']);
    // a null reading between 2 and 30 s: the device was not shown then
    expect(data[0]).toEqual([1, 2, 16, 30]);
    expect(data[1]).toEqual([0, 4 * MiB, null, 2 * MiB]);
    const host = timelineData([
      { time: 1, allocated: null, reserved: null, used: 5 * MiB, tracked: MiB },
      { time: 2, allocated: null, reserved: null, used: 6 * MiB, tracked: null }
    ]);
    expect(host.specs.map(s => s.key)).toEqual(['process', 'tracked']);
  });

  it('clips cell bands to the time shown; a running cell reaches the right edge', () => {
    expect(
      visibleBands(
        [
          { start: 0, end: 1 },
          { start: 5, end: 7 },
          { start: 9, end: null }
        ],
        2,
        10
      )
    ).toEqual([
      [5, 7],
      [9, 10]
    ]);
  });

  it('spans at least 30 s, up to the newest reading', () => {
    expect(timeRange(100, 100)).toEqual([70, 100]);
    expect(timeRange(0, 300)).toEqual([0, 300]);
  });

  it('ticks the byte axis at round values from 0, its top one of them', () => {
    expect(byteTicks(44 * MiB)).toEqual({
      splits: [0, 20 * MiB, 40 * MiB, 60 * MiB],
      top: 60 * MiB
    });
    expect(byteTicks(60 * MiB).top).toBe(60 * MiB);
    expect(byteTicks(23.5 * 1024 * MiB).splits.map(axisBytes)).toEqual([
      '0',
      '10 GiB',
      '20 GiB',
      '30 GiB'
    ]);
    expect(byteTicks(0).splits).toEqual([0, 1]);
  });

  it('ticks the time axis at round seconds, several across the chart', () => {
    // 30 s on a 260 px sidebar: every 10 s, not one label near the end
    expect(timeTicks(1003, 1033, 260)).toEqual([1010, 1020, 1030]);
    expect(timeTicks(0, 300, 260)).toEqual([0, 60, 120, 180, 240, 300]);
    // a narrow chart (the sidebar's plot, its byte axis aside) still gets three
    expect(timeTicks(1003, 1033, 150)).toEqual([1010, 1020, 1030]);
    const many = timeTicks(1000, 1120, 600);
    const step = many[1] - many[0];
    expect(many.length).toBeGreaterThanOrEqual(4);
    expect(TIME_STEPS).toContain(step);
    expect(many.every(t => t % step === 0)).toBe(true);
  });

  it('labels the byte axis short', () => {
    expect(axisBytes(0)).toBe('0');
    expect(axisBytes(4 * 1024 * MiB)).toBe('4 GiB');
    expect(axisBytes(1.5 * MiB)).toBe('1.5 MiB');
  });

  it('keeps one chart per device shown, in order', () => {
    const view = new TimelineView();
    const timeline = new Map<string, ITimelinePoint[]>([
      ['cuda:0', gpu],
      ['cpu', [{ time: 1, allocated: null, reserved: null, used: 5 * MiB }]]
    ]);
    view.update(timeline, ['cuda:0', 'cpu'], [], 0);
    const first = view.charts.get('cuda:0')!;
    expect(
      $$(view.node, '.jp-GpuMem-chartBox').map(b => b.dataset.device)
    ).toEqual(['cuda:0', 'cpu']);
    expect(first.node.dataset.points).toBe('3');
    expect(first.node.getAttribute('aria-label')).toBe(
      'cuda:0: allocated 2.0 MiB, reserved 8.0 MiB, process 20.0 MiB'
    );
    view.update(timeline, ['cuda:0'], [], 0);
    expect(view.charts.get('cuda:0')).toBe(first);
    expect(view.charts.has('cpu')).toBe(false);
  });
});

describe('holders and hints', () => {
  it('renders backticked code as <code>, and kernel text never as HTML', () => {
    const box = document.createElement('div');
    box.append(
      renderCodeText(
        'store `loss.item()` or end with `;` <img src=x onerror=alert(1)>'
      )
    );
    expect($$(box, 'code').map(c => c.textContent)).toEqual([
      'loss.item()',
      ';'
    ]);
    expect(box.querySelector('img')).toBeNull();
    expect(box.textContent).toContain('<img src=x onerror=alert(1)>');
    const odd = document.createElement('div');
    odd.append(renderCodeText('a `b` c `d'));
    expect($$(odd, 'code').map(c => c.textContent)).toEqual(['b']);
    expect(odd.textContent).toBe('a b c `d');
  });

  it('has no empty column: every column has a header and a value in each row', () => {
    const table = new HoldersTable(() => undefined);
    table.update(
      snapshot({
        holders: [
          holder({ hint: 'end the line with `;`' }),
          holder({
            name: 'Out[5]',
            label: 'Out[5]',
            aliases: ['_5', '_'],
            unique: 0,
            shared: 4 * MiB
          })
        ]
      }),
      new Set()
    );
    const node = table.node;
    const headers = $$(node, 'th').filter(th => !th.hidden);
    expect(headers.map(th => th.textContent)).toEqual([
      '',
      'Name',
      'Type',
      'Frees',
      'Shared'
    ]);
    for (const row of $$(node, 'tr.jp-GpuMem-holder')) {
      expect($$(row, 'td').length).toBe(headers.length);
      $$(row, 'td')
        .slice(1)
        .forEach(td => expect(td.textContent).not.toBe(''));
    }
    // the hint has a line of its own, above the table
    const hint = $(node, '.jp-GpuMem-hints .jp-GpuMem-hint');
    expect($(hint, 'code').textContent).toBe(';');
    // a name that shares its storage: it frees nothing, the rest is shared
    const out = $(node, 'tr[data-name="Out[5]"]');
    expect($(out, '.jp-GpuMem-frees').textContent).toBe('0 B');
    expect($(out, '.jp-GpuMem-sharedBytes').textContent).toBe('4.0 MiB');
    expect($(out, '.jp-GpuMem-sub').textContent).toBe(' also _5, _');
  });

  it('says how long the scan took in words a reader expects', () => {
    expect(formatSeconds(0)).toBe('<1 ms');
    expect(formatSeconds(0.0004)).toBe('<1 ms');
    expect(formatSeconds(0.042)).toBe('42 ms');
    expect(formatSeconds(2.345)).toBe('2.3 s');
    const node = h(
      'div',
      {},
      ...renderHolderNotes(snapshot({ scan_seconds: 0.0001 }))
    );
    expect($(node, '.jp-GpuMem-scanned').textContent).toMatch(
      /^1 holder · scanned at \d\d:\d\d:\d\d in <1 ms$/
    );
  });
});

describe('the holders table at scale', () => {
  const many = (n: number) =>
    snapshot({
      holders: Array.from({ length: n }, (_, i) =>
        holder({
          name: `Out[${i + 1}]`,
          label: `Out[${i + 1}]`,
          purge: `Out[${i + 1}]`,
          unique: (i % 7) * MiB,
          shared: (i % 3) * MiB,
          hint: 'Out keeps every value shown: `%gpumem purge Out`'
        })
      )
    });

  it('draws only the rows in view, and Out[N] in numeric order', () => {
    const table = new HoldersTable(() => undefined);
    table.update(many(2300), new Set());
    const rows = $$(table.node, 'tr.jp-GpuMem-holder');
    expect(rows.length).toBeLessThan(60);
    table.sortBy('name', false);
    expect(
      $$(table.node, 'tr.jp-GpuMem-holder')
        .slice(0, 3)
        .map(r => r.getAttribute('data-name'))
    ).toEqual(['Out[1]', 'Out[2]', 'Out[3]']);
    expect(table.rows[9].name).toBe('Out[10]');
    // one hint line for the 2,300 rows that share it, as the text report
    const hints = $$(table.node, '.jp-GpuMem-hint');
    expect(hints.length).toBe(1);
    expect(hints[0].textContent).toContain(
      'Out[1], Out[2], Out[3] and 2297 more'
    );
  });

  it('sorts by what it shows: Frees, then Shared', () => {
    const table = new HoldersTable(() => undefined);
    table.update(many(20), new Set());
    const frees = table.rows.map(r => r.unique);
    expect(frees).toEqual([...frees].sort((a, b) => b - a));
    table.sortBy('shared');
    const shared = table.rows.map(r => r.shared);
    expect(shared).toEqual([...shared].sort((a, b) => b - a));
  });

  it('filters, and selects every row shown in one action', () => {
    const toggled: [string[], boolean][] = [];
    const table = new HoldersTable((names, checked) =>
      toggled.push([names, checked])
    );
    const snap = many(50);
    snap.holders.push(holder());
    table.update(snap, new Set());
    table.filter = 'out[';
    expect(table.rows.length).toBe(50);
    const all = $(table.node, 'input.jp-GpuMem-checkAll') as HTMLInputElement;
    all.checked = true;
    all.dispatchEvent(new Event('change'));
    expect(toggled.length).toBe(1);
    expect(toggled[0][0].length).toBe(50);
    expect(toggled[0][0]).not.toContain('big');
  });

  it('keeps the focus on a box checked from the keyboard', () => {
    const ctx = openSidebar();
    ready(ctx, many(30));
    const box = $(
      ctx.sidebar.node,
      'tr[data-name="Out[7]"] input'
    ) as HTMLInputElement;
    box.focus();
    box.checked = true;
    box.dispatchEvent(new Event('change'));
    expect(ctx.model.selected.has('Out[7]')).toBe(true);
    expect(document.activeElement).toBe(box);
    expect(box.checked).toBe(true);
  });
});

describe('GpuMemSidebar', () => {
  it('says when no notebook is in focus', () => {
    const { sidebar } = openSidebar({
      answer: false,
      attach: false,
      notebook: null
    });
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
    expect(ctx.session.kernel.executed.map(e => e.code)).toEqual([
      '%load_ext jupyter_gpumem'
    ]);
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
            total: MiB,
            purge: 'Out[3]',
            hint: 'end the line with ;'
          }),
          holder({
            name: 'last traceback',
            label: 'last traceback (f(): t)',
            purge: null,
            unique: 512,
            total: 512
          })
        ]
      })
    );
    const rows = $$(ctx.sidebar.node, 'tr.jp-GpuMem-holder');
    expect(rows.map(r => r.dataset.name)).toEqual([
      'big',
      'Out[3]',
      'last traceback'
    ]);
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
    const box = $(
      ctx.sidebar.node,
      'tr[data-name="big"] input'
    ) as HTMLInputElement;
    box.checked = true;
    box.dispatchEvent(new Event('change'));
    expect(ctx.model.selected.has('big')).toBe(true);
    expect(purge.disabled).toBe(false);
    expect(purge.textContent).toBe('Purge selected (1) · frees 4.0 MiB');
    purge.click();
    await flush();
    expect(ctx.asked).toEqual([[['big'], 4 * MiB]]);
    expect(ctx.comm().sent).toEqual([
      { type: 'purge', id: 2, names: ['big'], dry_run: false }
    ]);

    purged(ctx, 2);
    emptied(ctx);
    expect(ctx.sidebar.node.textContent).toContain(
      'Purged big: freed cpu 4.0 MiB.'
    );
    expect($$(ctx.sidebar.node, 'tr.jp-GpuMem-holder')).toEqual([]);
    expect(ctx.sidebar.node.textContent).toContain(
      'No name holds memory on "cpu"'
    );
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

  it('on auto with no GPU says plainly that it shows the host, with no button', () => {
    const ctx = setUp();
    ready(
      ctx,
      snapshot({
        device: 'auto',
        accelerator: false,
        messages: ['no accelerator: showing host tensors (device cpu)'],
        devices: [
          device({ name: 'host memory', allocated: null, reserved: null })
        ]
      })
    );
    const text = ctx.sidebar.node.textContent!;
    expect(text).toContain(
      'No GPU in this kernel: showing host memory and the tensors on it.'
    );
    expect(text).not.toContain('No accelerator in this kernel');
    expect(text).not.toContain('no accelerator:');
    expect($(ctx.sidebar.node, '.jp-GpuMem-useCpu')).toBeNull();
    expect($(ctx.sidebar.node, '.jp-GpuMem-title').textContent).toBe(
      'Host memory'
    );
    expect($$(ctx.sidebar.node, 'tr.jp-GpuMem-holder').length).toBe(1);
  });

  it('offers the host when the device chosen is not in this kernel', () => {
    const ctx = withoutCuda0();
    expect(ctx.sidebar.node.textContent).toContain(
      'This kernel has no cuda:0.'
    );
    ($(ctx.sidebar.node, '.jp-GpuMem-useCpu') as HTMLButtonElement).click();
    expect(ctx.comm().sent).toEqual([
      { type: 'set_device', id: 2, device: 'cpu' }
    ]);
    const select = $(ctx.sidebar.node, 'select') as HTMLSelectElement;
    expect(select.value).toBe('cpu');
  });

  it('keeps each device timeline when the device selection changes', () => {
    const ctx = setUp();
    ready(ctx);
    ctx.comm().receive({ type: 'devices', time: 1001, devices: [device()] });
    ctx.comm().receive({ type: 'devices', time: 1002, devices: [device()] });
    expect(ctx.model.timeline.get('cpu')!.length).toBe(3);
    ctx.channel.setDevice('all');
    ctx.comm().receive({
      type: 'devices',
      time: 1003,
      devices: [device(), device({ id: 'cuda:0', kind: 'cuda' })]
    });
    expect(ctx.model.timeline.get('cpu')!.length).toBe(4);
    ctx.channel.setDevice('cpu');
    expect(ctx.model.timeline.get('cpu')!.length).toBe(4);
    expect(ctx.model.timeline.get('cuda:0')!.length).toBe(1);
  });

  it('times cells from the kernel messages, for the bands of the timeline', () => {
    const ctx = setUp();
    ready(ctx);
    ctx.session.iopubMessage.emit({
      header: { msg_type: 'execute_input' }
    } as any);
    expect(ctx.model.cells.length).toBe(1);
    expect(ctx.model.cells[0].end).toBeNull();
    ctx.session.statusChanged.emit('idle');
    expect(ctx.model.cells[0].end).not.toBeNull();
    // a snapshot may tell its cell too
    ctx.comm().receive({
      type: 'snapshot',
      snapshot: { ...snapshot(), cell: { start: 5, end: 6 } }
    });
    expect(ctx.model.cells.map(c => c.start)).toContain(5);
  });

  it('clears an old purge result when a newer snapshot arrives, or on dismiss', () => {
    const ctx = setUp();
    ready(ctx);
    purged(ctx, 2);
    // the snapshot that follows the purge shows its effect, with the result
    emptied(ctx);
    expect($(ctx.sidebar.node, '.jp-GpuMem-purgeResult')).not.toBeNull();
    // the next one (a cell ran, a refresh) is newer than the purge
    emptied(ctx);
    expect($(ctx.sidebar.node, '.jp-GpuMem-purgeResult')).toBeNull();

    purged(ctx, 3);
    ($(ctx.sidebar.node, '.jp-GpuMem-dismiss') as HTMLButtonElement).click();
    expect($(ctx.sidebar.node, '.jp-GpuMem-purgeResult')).toBeNull();
    expect(ctx.model.lastPurge).toBeNull();
  });

  it('asks for the snapshot after a purge if the kernel does not push it', async () => {
    const ctx = setUp();
    ctx.sidebar.poll.dispose(); // only the purge's own request is counted here
    ready(ctx);
    purged(ctx, 2);
    expect(ctx.comm().sent).toEqual([]);
    await new Promise(resolve => setTimeout(resolve, 1600));
    expect(ctx.comm().sent).toEqual([{ type: 'refresh', id: 2 }]);
    // pushed in time: nothing asked
    ctx.comm().sent = [];
    purged(ctx, 3);
    emptied(ctx);
    await new Promise(resolve => setTimeout(resolve, 1600));
    expect(ctx.comm().sent).toEqual([]);
  });

  it('applies a new refresh interval to its poll', () => {
    const ctx = setUp();
    ctx.sidebar.refreshInterval = 2000;
    expect(ctx.sidebar.poll.frequency.interval).toBe(2000);
    ctx.sidebar.refreshInterval = -1;
    expect(ctx.sidebar.poll.frequency.interval).toBe(2000);
  });

  it('changes device from the menu, which lists devices seen', () => {
    const ctx = setUp();
    ready(ctx);
    ctx.comm().receive({
      type: 'devices',
      time: 2000,
      devices: [
        device({ id: 'cuda:0', kind: 'cuda' }),
        device({ id: 'cuda:1', kind: 'cuda' })
      ]
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
    expect(ctx.comm().sent).toEqual([
      { type: 'set_device', id: 2, device: 'cuda:1' }
    ]);
  });

  it('shows the kernel error line', () => {
    const ctx = setUp();
    ready(ctx);
    ctx
      .comm()
      .receive({ type: 'error', message: "no name 'x' (nothing was deleted)" });
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
    const ctx = withoutCuda0();
    const button = $(ctx.sidebar.node, '.jp-GpuMem-useCpu');
    ctx.comm().receive({ type: 'devices', time: 2000, devices: [device()] });
    expect($(ctx.sidebar.node, '.jp-GpuMem-useCpu')).toBe(button);
  });

  it('renders only when shown, then catches up', () => {
    const ctx = setUp();
    ready(ctx);
    ctx.sidebar.hide();
    ctx.comm().receive({
      type: 'snapshot',
      snapshot: snapshot({
        holders: [holder({ name: 'later', purge: 'later' })]
      })
    });
    expect($(ctx.sidebar.node, 'tr[data-name="later"]')).toBeNull();
    ctx.sidebar.show();
    expect($(ctx.sidebar.node, 'tr[data-name="later"]')).not.toBeNull();
  });

  it('refreshes through its poll while visible', async () => {
    const { sidebar, session } = openSidebar({
      answer: false,
      refreshInterval: 20
    });
    hello(session.kernel.lastComm);
    session.kernel.lastComm.sent = [];
    await new Promise(resolve => setTimeout(resolve, 150));
    const refreshes = session.kernel.lastComm.sent.filter(
      m => m.type === 'refresh'
    );
    expect(refreshes.length).toBeGreaterThanOrEqual(2);
    sidebar.hide();
    session.kernel.lastComm.sent = [];
    await new Promise(resolve => setTimeout(resolve, 100));
    expect(session.kernel.lastComm.sent).toEqual([]);
  });
});

describe('never silent', () => {
  it('shows a queued purge with Cancel, and a request with no answer with Retry', async () => {
    vi.useFakeTimers();
    try {
      const ctx = openSidebar();
      ctx.comm().receive({
        type: 'hello',
        version: '0.2.0',
        device: 'auto',
        busy: true
      });
      ctx
        .comm()
        .receive({ type: 'snapshot', snapshot: snapshot(), reply_to: 1 });
      ctx.model.toggle('big', true);
      await ctx.sidebar.purgeSelected();
      const id = ctx.comm().sent.find(m => m.type === 'purge')!.id;
      ctx.comm().receive({
        type: 'queued',
        reply_to: id,
        request: 'purge',
        message: 'queued: runs when the cell ends'
      });
      const queued = $(ctx.sidebar.node, '.jp-GpuMem-queued');
      expect(queued.textContent).toContain(
        'The purge: queued: runs when the cell ends'
      );
      ($(queued, 'button') as HTMLButtonElement).click();
      expect(ctx.comm().sent[ctx.comm().sent.length - 1]).toMatchObject({
        type: 'cancel',
        request: id
      });
      ctx.channel.refresh();
      vi.advanceTimersByTime(10500);
      const missed = $(ctx.sidebar.node, '.jp-GpuMem-noAnswer');
      expect(missed.textContent).toContain(
        'No answer from the kernel of demo.ipynb to the scan after 10 s.'
      );
      ($(missed, 'button.jp-GpuMem-retry') as HTMLButtonElement).click();
      expect(ctx.comm().sent[ctx.comm().sent.length - 1].type).toBe('refresh');
      expect(ctx.sidebar.node.querySelector('.jp-GpuMem-noAnswer')).toBeNull();
    } finally {
      vi.useRealTimers();
    }
  });
});
