/**
 * Snapshots with a cluster part made by the real kernel side (a real Dask
 * LocalCluster; tests/cluster/test_cluster_magics.py writes them to the file named in
 * GPUMEM_CLUSTER_MESSAGES): every one passes the sidebar's checks, and the
 * sidebar shows the workers' bars and the names that hold keys.
 */
import { readFileSync } from 'fs';
import { describe, expect, it } from 'vitest';

import { parseKernelMessage } from '../src/protocol';
import { hello, openSidebar } from './helpers';

const path = process.env.GPUMEM_CLUSTER_MESSAGES;

/** Messages in the order the kernel sent them, and what the sidebar shows after the last. */
interface ICase {
  messages: any[];
  holders: string[];
  workers: string[];
}

describe.skipIf(!path)('cluster snapshots from the real kernel side', () => {
  const cases: ICase[] = path ? JSON.parse(readFileSync(path, 'utf8')) : [];

  it('pass the protocol checks with their cluster part kept', () => {
    expect(cases.length).toBeGreaterThan(0);
    for (const message of cases.flatMap(c => c.messages)) {
      const parsed = parseKernelMessage(message);
      expect(parsed.ok ? 'ok' : parsed.reason).toBe('ok');
      if (parsed.ok && parsed.message.type === 'snapshot') {
        expect(message.snapshot.cluster).toBeTruthy();
        expect(parsed.message.snapshot.cluster).toEqual(
          message.snapshot.cluster
        );
      }
    }
  });

  it('render one bar per worker device and a row per cluster holder', () => {
    for (const { messages, holders, workers } of cases) {
      const { sidebar, comm: newest } = openSidebar({
        attach: false,
        notebook: 'cluster.ipynb'
      });
      const comm = newest();
      hello(comm, 'cpu');
      for (const message of messages) {
        comm.receive(message);
      }
      const bars = Array.from(
        sidebar.node.querySelectorAll('.jp-GpuMem-workerDevice b')
      ).map(b => b.textContent);
      expect(bars).toEqual(workers);
      const rows = Array.from(
        sidebar.node.querySelectorAll('tr.jp-GpuMem-clusterHolder')
      ) as HTMLElement[];
      expect(rows.map(r => r.dataset.name)).toEqual(holders);
      sidebar.dispose();
    }
  });
});
