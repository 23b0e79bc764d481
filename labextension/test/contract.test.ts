/**
 * Messages made by the real kernel side (jupyter_gpumem/comm.py), written by
 * tests/labextension/test_labextension.py to the file named in GPUMEM_KERNEL_MESSAGES:
 * every one must pass the sidebar's checks and render.
 */
import { readFileSync } from 'fs';
import { describe, expect, it } from 'vitest';

import { parseKernelMessage } from '../src/protocol';
import { openSidebar } from './helpers';

const path = process.env.GPUMEM_KERNEL_MESSAGES;

describe.skipIf(!path)('messages from the real kernel side', () => {
  const messages: any[] = path ? JSON.parse(readFileSync(path, 'utf8')) : [];

  it('covers every kernel message type', () => {
    const types = new Set(messages.map(m => m.type));
    for (const type of [
      'hello',
      'devices',
      'snapshot',
      'purge_result',
      'error'
    ]) {
      expect(types.has(type), type).toBe(true);
    }
  });

  it('all pass the protocol checks', () => {
    for (const message of messages) {
      const parsed = parseKernelMessage(message);
      expect(parsed.ok ? 'ok' : parsed.reason).toBe('ok');
    }
  });

  it('render: the tensor is listed, then purged', () => {
    const {
      model,
      sidebar,
      comm: newest
    } = openSidebar({
      attach: false,
      notebook: 'contract.ipynb'
    });
    const comm = newest();
    let sawBig = false;
    for (const message of messages) {
      comm.receive(message);
      if (
        message.type === 'snapshot' &&
        message.snapshot.holders.some((h: any) => h.name === 'big')
      ) {
        const row = sidebar.node.querySelector('tr[data-name="big"]');
        expect(row?.textContent).toContain('4.0 MiB');
        sawBig = true;
      }
    }
    expect(sawBig).toBe(true);
    expect(model.lastPurge?.removed).toContain('big');
    expect(sidebar.node.querySelector('tr[data-name="big"]')).toBeNull();
    expect(
      sidebar.node.querySelectorAll('.jp-GpuMem-device').length
    ).toBeGreaterThan(0);
    sidebar.dispose();
  });
});
