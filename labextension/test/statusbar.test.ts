import { describe, expect, it } from 'vitest';

import { serverReader } from '../src/kernels';
import { SidebarModel } from '../src/model';
import { MemoryStatusItem, statusText } from '../src/statusbar';
import { device, MiB } from './helpers';

describe('the status bar item', () => {
  it('says the host memory of the kernel in focus where there is no GPU', () => {
    const model = new SidebarModel();
    model.show('k1', 'a.ipynb', 'connecting');
    expect(statusText(model).text).toBe('Kernel memory: –');
    model.handle({ type: 'hello', version: '0.1.0', device: 'auto' });
    model.handle({ type: 'devices', time: 1, devices: [device()] });
    const shown = statusText(model);
    expect(shown.text).toBe('Host 30.0 MiB / 100.0 MiB');
    expect(shown.warn).toBe(false);
  });

  it('shows a GPU before the host, and warns past the share set', () => {
    const model = new SidebarModel();
    model.show('k1', 'a.ipynb', 'connecting');
    model.handle({ type: 'hello', version: '0.1.0', device: 'all' });
    const gpu = device({
      id: 'cuda:0',
      kind: 'cuda',
      total: 100 * MiB,
      free: 5 * MiB,
      used_process: 60 * MiB
    });
    model.handle({ type: 'devices', time: 1, devices: [device(), gpu] });
    expect(statusText(model, 0.9)).toMatchObject({
      text: 'cuda:0 60.0 MiB / 100.0 MiB',
      warn: true
    });
    expect(statusText(model, 0.99).warn).toBe(false);
    let clicked = 0;
    const item = new MemoryStatusItem(model, () => (clicked += 1));
    item.warnShare = 0.9;
    expect(item.node.classList.contains('jp-GpuMem-mod-warn')).toBe(true);
    item.node.click();
    expect(clicked).toBe(1);
    item.dispose();
  });
});

describe('the server reading of a kernel without an open comm', () => {
  it("reads the kernel's host memory and GPU bytes from the endpoint", async () => {
    const answer = (gpu: boolean) => ({
      schema: 'jupyter_gpumem.kernels/1',
      gpu,
      message: gpu
        ? null
        : 'NVMLError_LibraryNotFound: NVML Shared Library Not Found',
      kernels: [
        {
          id: 'k1',
          name: 'python3',
          path: 'a.ipynb',
          type: 'notebook',
          pid: 1,
          pid_note: null,
          children: [],
          gpu: gpu ? { 'cuda:0': 3 * MiB } : {},
          gpu_bytes: gpu ? 3 * MiB : 0,
          execution_state: 'busy',
          host: { rss: 200 * MiB }
        }
      ],
      others: [],
      orphans: []
    });
    let gpu = true;
    const read = serverReader({ request: async () => answer(gpu) });
    expect(await read('k1')).toMatchObject({
      rss: 200 * MiB,
      gpu: { 'cuda:0': 3 * MiB },
      message: null
    });
    expect(await read('nosuch')).toBeNull();
    gpu = false;
    const reading = await read('k1');
    expect(reading?.message).toBe(
      'GPU figures need NVML (the NVIDIA driver); none here'
    );
    // into the model: the timeline gets the reading while the comm is not open
    const model = new SidebarModel();
    model.show('k1', 'a.ipynb', 'connecting');
    model.setServerReading(reading);
    expect(model.timeline.get('cpu')!.map(p => p.used)).toEqual([200 * MiB]);
    expect(statusText(model).text).toBe('Kernel: host 200.0 MiB');
  });
});
