/**
 * The cluster part of a snapshot (a Dask cluster the notebook drives): worker
 * device bars under the local ones and the names that hold keys on the cluster.
 */
import { afterEach, describe, expect, it } from 'vitest';

import { parseKernelMessage } from '../src/protocol';
import {
  clusterWhere,
  renderClusterDevices,
  renderClusterHolders
} from '../src/viewCluster';
import { barSegments, renderDevice, workerLabel } from '../src/viewDevices';
import {
  $,
  $$,
  cluster,
  clusterHolder,
  clusterWorker,
  device,
  disposeSidebars,
  expectProcessScale,
  MiB,
  openSidebar,
  ready,
  snapshot,
  W0,
  W1,
  workerDevice
} from './helpers';

afterEach(disposeSidebars);

function sidebarWith(snap = snapshot({ cluster: cluster() })) {
  const ctx = openSidebar({ notebook: 'dask.ipynb' });
  ready(ctx, snap, 'cpu');
  return { model: ctx.model, sidebar: ctx.sidebar, comm: ctx.comm() };
}

describe('protocol: the cluster part', () => {
  it('accepts a snapshot with a cluster part as it is', () => {
    const message = {
      type: 'snapshot',
      snapshot: snapshot({ cluster: cluster() })
    };
    expect(parseKernelMessage(message)).toEqual({ ok: true, message });
  });

  it('keeps a snapshot without one, or with null, unchanged (older kernels)', () => {
    for (const snap of [snapshot(), snapshot({ cluster: null })]) {
      const message = { type: 'snapshot', snapshot: snap };
      expect(parseKernelMessage(message)).toEqual({ ok: true, message });
    }
  });

  it.each([
    [
      { ...cluster(), schema: 'jupyter_gpumem.cluster/2' },
      'jupyter_gpumem.cluster/2'
    ],
    [{ ...cluster(), workers: [{ address: 1 }] }, 'jupyter_gpumem.cluster/1'],
    [{ ...cluster(), holders: [{ name: 'x' }] }, 'jupyter_gpumem.cluster/1'],
    [{ ...cluster(), unclaimed: 'x' }, 'jupyter_gpumem.cluster/1'],
    ['nope', '?']
  ])(
    'leaves out a cluster part it cannot show, says so, keeps the rest (%#)',
    (part, schema) => {
      const snap = { ...snapshot(), cluster: part as any };
      const parsed = parseKernelMessage({ type: 'snapshot', snapshot: snap });
      expect(parsed.ok).toBe(true);
      const shown =
        parsed.ok && parsed.message.type === 'snapshot'
          ? parsed.message.snapshot
          : null;
      expect(shown?.cluster).toBeNull();
      expect(shown?.holders).toEqual(snap.holders);
      expect(shown?.messages).toEqual([
        `cluster part not shown: not a jupyter_gpumem.cluster/1 (${schema})`
      ]);
      expect(snap.cluster).toBe(part); // the message itself is not changed
    }
  );
});

describe('worker device bars', () => {
  it('labels a worker device "worker host:port device"', () => {
    expect(workerLabel('tcp://10.0.0.5:40123')).toBe('10.0.0.5:40123');
    expect(workerLabel('10.0.0.5:40123')).toBe('10.0.0.5:40123');
    const node = renderDevice(
      device({
        id: 'cuda:1',
        kind: 'cuda',
        name: 'NVIDIA H200',
        allocated: 2 * MiB
      }),
      'tcp://10.0.0.5:40123'
    );
    expect($(node, 'b').textContent).toBe('worker 10.0.0.5:40123 cuda:1');
    expect(node.dataset.worker).toBe('tcp://10.0.0.5:40123');
    expect(node.dataset.device).toBe('cuda:1');
    expect(node.classList.contains('jp-GpuMem-workerDevice')).toBe(true);
    expect(node.textContent).toContain('allocated 2.0 MiB');
  });

  it("shows a worker's host tensors where the host has no allocator counters", () => {
    const dev = workerDevice({
      attributed: 64 * MiB,
      used_process: 300 * MiB,
      free: 600 * MiB
    });
    expect(barSegments(dev, true).map(s => [s.label, s.bytes])).toEqual([
      ['tracked tensors', 64 * MiB],
      ['reserved, free', 0],
      ['rest of the process', 236 * MiB],
      ['other processes', 0],
      ['free', 600 * MiB]
    ]);
    // the local host is drawn the same way
    expect(barSegments(dev)[0]).toEqual({
      key: 'allocated',
      label: 'tracked tensors',
      bytes: 64 * MiB
    });
    // at the scale of the worker's process (its tensors are not lost in the host's total)
    expectProcessScale(
      renderDevice(dev, W0),
      '21.33%',
      '78.67%',
      'tracked tensors 64.0 MiB, process 300.0 MiB'
    );
  });

  it('draws one bar per worker device, and names the workers that did not answer', () => {
    const part = cluster({
      workers: [
        clusterWorker({
          devices: [
            device({ id: 'cuda:0', kind: 'cuda' }),
            device({ id: 'cuda:1', kind: 'cuda' })
          ]
        })
      ],
      missing: { [W1]: 'did not answer within 1 s' },
      partial: true
    });
    const node = renderClusterDevices(part);
    expect($$(node, '.jp-GpuMem-device b').map(b => b.textContent)).toEqual([
      'worker 127.0.0.1:40125 cuda:0',
      'worker 127.0.0.1:40125 cuda:1'
    ]);
    expect(node.textContent).toContain(
      'cluster tcp://127.0.0.1:8786 · 1 of 2 workers answered'
    );
    expect($(node, '.jp-GpuMem-missingWorker').textContent).toBe(
      'worker 127.0.0.1:44097: did not answer within 1 s'
    );
  });
});

describe('cluster holders', () => {
  it('lists each name with what it is, its bytes, where and its keys', () => {
    const node = renderClusterHolders(cluster());
    const rows = $$(node, 'tr.jp-GpuMem-clusterHolder');
    expect(rows.map(r => r.dataset.name)).toEqual(['x', 'emb']);
    expect(
      rows.map(r => Array.from(r.children).map(td => td.textContent))
    ).toEqual([
      ['x', 'Future', '64.0 MiB', 'worker 127.0.0.1:40125 cpu', '1 of 1'],
      [
        'emb',
        'persisted dask.bag, 4 chunks',
        '16.0 MiB',
        'worker 127.0.0.1:44097 cpu',
        '4 of 4'
      ]
    ]);
    expect(rows[0].title).toContain('free it: %gpumem purge x --cluster');
    expect($$(node, 'input')).toEqual([]); // purged with %gpumem purge --cluster, not here
  });

  it('says where a holder on several workers is, and its keys not in memory', () => {
    const holder = clusterHolder({
      name: 'arr',
      keys: 5,
      in_memory: 4,
      workers: {
        [W0]: { cpu: 4 * MiB },
        [W1]: { cpu: 4 * MiB },
        'tcp://gone:1': { cpu: 0 }
      },
      not_in_memory: { 'on a worker that did not answer': 1 }
    });
    expect(clusterWhere(holder)).toBe('2 workers');
    const node = renderClusterHolders(cluster({ holders: [holder] }));
    const cells = $$(node, 'tbody td').map(td => td.textContent);
    expect(cells[3]).toBe('2 workers');
    expect(cells[4]).toBe('4 of 5 (1 on a worker that did not answer)');
  });

  it('lists keys no name holds, with who does, and counts those left off', () => {
    const unclaimed = [1, 2, 3, 4, 5, 6].map(i => ({
      key: `k-${i}`,
      worker: W0,
      devices: { cpu: MiB },
      bytes: MiB,
      sizeof: MiB,
      held_by: [i === 1 ? 'another client Client-2' : "published dataset 'p'"],
      state: 'memory'
    }));
    const node = renderClusterHolders(
      cluster({
        holders: [],
        unclaimed,
        unclaimed_left_off: { keys: 10, bytes: 10 * MiB }
      })
    );
    expect(node.textContent).toContain(
      'No name of this notebook holds a key on the cluster.'
    );
    expect(node.textContent).toContain(
      'In worker memory, held by no name of this notebook: 16 keys, 16.0 MiB'
    );
    const lines = $$(node, '.jp-GpuMem-unclaimed');
    expect(lines.length).toBe(5);
    expect(lines[0].textContent).toBe(
      'k-1 1.0 MiB on worker 127.0.0.1:40125: held by another client Client-2'
    );
    expect(node.textContent).toContain('… and 11 more');
  });
});

describe('GpuMemSidebar with a cluster', () => {
  it('shows the worker bars under the local ones and the cluster holders under the local', () => {
    const { sidebar } = sidebarWith();
    const bars = $$(sidebar.node, '.jp-GpuMem-device');
    expect(bars.map(b => $(b, 'b').textContent)).toEqual([
      'cpu',
      'worker 127.0.0.1:40125 cpu',
      'worker 127.0.0.1:44097 cpu'
    ]);
    const rows = $$(sidebar.node, 'tr.jp-GpuMem-holder');
    expect(
      rows.map(r => [
        r.dataset.name,
        r.classList.contains('jp-GpuMem-clusterHolder')
      ])
    ).toEqual([
      ['big', false],
      ['x', true],
      ['emb', true]
    ]);
  });

  it('keeps the worker bars across device readings, until a snapshot without a cluster', () => {
    const { sidebar, comm } = sidebarWith();
    comm.receive({ type: 'devices', time: 2000, devices: [device()] });
    expect($$(sidebar.node, '.jp-GpuMem-workerDevice').length).toBe(2);
    comm.receive({ type: 'snapshot', snapshot: snapshot({ time: 3000 }) });
    expect($$(sidebar.node, '.jp-GpuMem-workerDevice')).toEqual([]);
    expect($$(sidebar.node, '.jp-GpuMem-clusterHolder')).toEqual([]);
    expect(
      $$(sidebar.node, 'tr.jp-GpuMem-holder').map(r => r.dataset.name)
    ).toEqual(['big']);
  });

  it('purges only local names: cluster rows have no checkbox, the selection is unchanged', () => {
    const { sidebar, model } = sidebarWith();
    model.toggle('x', true); // a cluster holder's name is not a local purge target
    expect(model.selected.size).toBe(0);
    expect($$(sidebar.node, 'tr.jp-GpuMem-clusterHolder input')).toEqual([]);
    expect($$(sidebar.node, 'tr[data-name="big"] input').length).toBe(1);
  });

  it('shows a partial cluster answer and its notes', () => {
    const { sidebar } = sidebarWith(
      snapshot({
        cluster: cluster({
          partial: true,
          messages: [
            'worker tcp://127.0.0.1:44097 did not answer within 1 s: its keys are not counted'
          ]
        })
      })
    );
    expect(sidebar.node.textContent).toContain(
      'Partial answer from the cluster'
    );
    expect(sidebar.node.textContent).toContain('its keys are not counted');
  });
});
