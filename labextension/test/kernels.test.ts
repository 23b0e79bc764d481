import { describe, expect, it } from 'vitest';

import {
  holdingKernels,
  IKernelsBackend,
  KernelsSection,
  NO_NVML_MESSAGE
} from '../src/kernels';
import { IServerKernels, parseServerKernels } from '../src/protocol';
import { KERNELS_PATH, ORPHANS_PATH } from '../src/request';

const MiB = 1 << 20;
const GiB = 1 << 30;

function kernel(
  id: string,
  path: string | null,
  bytes: number,
  pid: number | null
) {
  return {
    id,
    name: 'python3',
    path,
    type: 'notebook',
    pid,
    pid_note: pid === null ? 'pid unknown (a remote provisioner)' : null,
    children: pid === null ? [] : [pid + 1],
    gpu: (bytes ? { 'cuda:0': bytes } : {}) as { [device: string]: number },
    gpu_bytes: bytes,
    execution_state: 'idle'
  };
}

const orphan = {
  device: 'cuda:0',
  pid: 4242,
  bytes: 512 * MiB,
  relation: 'orphan',
  label: 'orphan: left by a kernel of c.ipynb (parent gone)',
  user: 'ana',
  command: 'python -c from multiprocessing.spawn',
  path: 'c.ipynb',
  purgeable: true
};

const theirs = {
  ...orphan,
  pid: 77,
  relation: 'other_user',
  label: "another user's (bob)",
  purgeable: false
};

function answer(over: Partial<IServerKernels> = {}): IServerKernels {
  return {
    schema: 'jupyter_gpumem.kernels/1',
    gpu: true,
    message: null,
    kernels: [
      kernel('a', 'a.ipynb', GiB, 100),
      kernel('b', 'work/b.ipynb', 2 * GiB, 200),
      kernel('c', 'c.ipynb', 0, 300),
      kernel('r', 'remote.ipynb', 0, null)
    ],
    others: [orphan, theirs],
    orphans: [orphan],
    ...over
  };
}

class FakeBackend implements IKernelsBackend {
  constructor(public data: unknown) {}
  calls: string[] = [];
  yes = true;
  async request(path: string, body?: unknown): Promise<unknown> {
    this.calls.push(
      `${body === undefined ? 'GET' : 'POST'} ${path} ${body ? JSON.stringify(body) : ''}`.trim()
    );
    if (path === ORPHANS_PATH) {
      return {
        steps: [{ pid: 4242, signal: 'SIGTERM', result: 'ended' }],
        freed: { 'cuda:0': 512 * MiB }
      };
    }
    if (this.data instanceof Error) {
      throw this.data;
    }
    return this.data;
  }
  async open(path: string): Promise<void> {
    this.calls.push(`open ${path}`);
  }
  async shutdown(id: string): Promise<void> {
    this.calls.push(`shutdown ${id}`);
  }
  async purgeHidden(id: string): Promise<string> {
    this.calls.push(`purge ${id}`);
    return 'Purged Out[3]: freed cuda:0 1.0 GiB.';
  }
  async confirm(title: string): Promise<boolean> {
    this.calls.push(`confirm ${title}`);
    return this.yes;
  }
}

const text = (root: HTMLElement, sel: string) =>
  [...root.querySelectorAll(sel)].map(n => n.textContent);

describe('the Kernels section', () => {
  it('lists the kernels that hold GPU memory, largest first, then the orphans and the others', async () => {
    const backend = new FakeBackend(answer());
    const s = new KernelsSection(backend);
    await s.refresh();
    expect(backend.calls).toEqual([`GET ${KERNELS_PATH}`]);
    expect(text(s.node, '.jp-GpuMem-srvKernelPath')).toEqual([
      'b.ipynb',
      'a.ipynb'
    ]);
    expect(text(s.node, '.jp-GpuMem-srvKernelBytes')).toEqual([
      '2.0 GiB',
      '1.0 GiB'
    ]);
    expect(text(s.node, '.jp-GpuMem-srvKernelWho')[0]).toBe(
      'pid 200 · 1 child(ren) · idle · cuda:0 2.0 GiB'
    );
    expect(text(s.node, '.jp-GpuMem-kernelsIdle')).toEqual([
      '2 other kernel(s) hold no GPU memory.'
    ]);
    expect(text(s.node, '.jp-GpuMem-orphans .jp-GpuMem-processPid')).toEqual([
      'pid 4242'
    ]);
    expect(text(s.node, '.jp-GpuMem-process .jp-GpuMem-processLabel')).toEqual([
      'cuda:0 · orphan: left by a kernel of c.ipynb (parent gone)',
      "cuda:0 · another user's (bob)"
    ]);
  });

  it('opens, purges, shuts down (confirmed) and ends the orphans (confirmed)', async () => {
    const backend = new FakeBackend(answer());
    const s = new KernelsSection(backend);
    await s.refresh();
    const b = s.data!.kernels[1];
    await s.openNotebook(b);
    expect(await s.purgeHidden(b)).toBe('Purged Out[3]: freed cuda:0 1.0 GiB.');
    backend.yes = false;
    expect(await s.shutdown(b)).toBe(false);
    expect(await s.endOrphans()).toBe(false);
    backend.yes = true;
    expect(await s.shutdown(b)).toBe(true);
    expect(await s.endOrphans()).toBe(true);
    expect(backend.calls.filter(c => !c.startsWith('GET'))).toEqual([
      'open work/b.ipynb',
      'purge b',
      'confirm Shut the kernel down?',
      'confirm End the orphans?',
      'confirm Shut the kernel down?',
      'shutdown b',
      'confirm End the orphans?',
      `POST ${ORPHANS_PATH} {"dry_run":false}`
    ]);
    expect(s.node.querySelector('.jp-GpuMem-kernelsStatus')!.textContent).toBe(
      'Ended 1 of 1 orphan(s); the GPUs got 512.0 MiB back.'
    );
  });

  it('says so without a GPU, and when the server extension does not answer', async () => {
    const backend = new FakeBackend(
      answer({
        gpu: false,
        message: 'no GPU: NVML sees no device',
        kernels: [],
        others: [],
        orphans: []
      })
    );
    const s = new KernelsSection(backend);
    await s.refresh();
    expect(text(s.node, '.jp-GpuMem-kernelsNone')).toEqual([
      'no GPU: NVML sees no device'
    ]);
    // a raw library error is never shown; every kernel is listed with its host memory
    backend.data = answer({
      gpu: false,
      message: 'NVMLError_LibraryNotFound: NVML Shared Library Not Found',
      kernels: [
        { ...kernel('a', 'x/small.ipynb', 0, 10), host: { rss: 100 * MiB } },
        { ...kernel('b', 'x/big.ipynb', 0, 20), host: { rss: 900 * MiB } }
      ],
      others: [],
      orphans: []
    });
    await s.refresh();
    expect(text(s.node, '.jp-GpuMem-kernelsNone')).toEqual([NO_NVML_MESSAGE]);
    expect(s.node.textContent).not.toContain('NVMLError');
    expect(text(s.node, '.jp-GpuMem-srvKernelPath')).toEqual([
      'big.ipynb',
      'small.ipynb'
    ]);
    expect(text(s.node, '.jp-GpuMem-srvKernelBytes')).toEqual([
      '900.0 MiB',
      '100.0 MiB'
    ]);
    backend.data = new Error('404 Not Found');
    await s.refresh();
    expect(text(s.node, '.jp-GpuMem-kernelsError')).toEqual([
      'The server extension did not answer: 404 Not Found'
    ]);
    backend.data = { schema: 'something else' };
    await s.refresh();
    expect(s.data).toBeNull();
  });

  it('parses only the endpoint schema; holding kernels only', () => {
    expect(() => parseServerKernels({ kernels: [] })).toThrow();
    expect(holdingKernels(answer()).map(k => k.id)).toEqual(['b', 'a']);
  });
});
