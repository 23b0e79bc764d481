import { describe, expect, it } from 'vitest';

import { parseKernelMessage, Requests } from '../src/protocol';
import { device, purgeResult, snapshot } from './helpers';

describe('parseKernelMessage', () => {
  it('accepts every message type of the protocol', () => {
    const messages = [
      { type: 'hello', version: '0.1.0', device: 'auto' },
      { type: 'devices', time: 1, devices: [device()] },
      { type: 'snapshot', snapshot: snapshot(), reply_to: 3 },
      { type: 'purge_result', result: purgeResult(), reply_to: 'a' },
      { type: 'error', message: 'no name "x"', reply_to: null }
    ];
    for (const message of messages) {
      const parsed = parseKernelMessage(message);
      expect(parsed).toEqual({ ok: true, message });
    }
  });

  it.each([
    [null, 'string "type"'],
    [[1], 'string "type"'],
    [{ type: 1 }, 'string "type"'],
    [{ type: 'nope' }, 'unknown message type "nope"'],
    [{ type: 'hello' }, 'no device'],
    [{ type: 'devices', devices: 'x' }, 'not a list'],
    [{ type: 'devices', devices: [{ kind: 'cpu' }] }, 'not a list'],
    [
      { type: 'snapshot', snapshot: { ...snapshot(), schema: 'other/2' } },
      'not a snapshot/1'
    ],
    [
      {
        type: 'snapshot',
        snapshot: { ...snapshot(), holders: [{ name: 'x' }] }
      },
      'not a snapshot/1'
    ],
    [
      { type: 'purge_result', result: { schema: 'jupyter_gpumem.purge/1' } },
      'not a purge/1'
    ],
    [{ type: 'error' }, 'no message']
  ])('rejects %j', (data, reason) => {
    const parsed = parseKernelMessage(data);
    expect(parsed.ok).toBe(false);
    expect(parsed.ok ? '' : parsed.reason).toContain(reason);
  });
});

describe('Requests', () => {
  it('builds exactly the requests of docs/PROTOCOL.md', () => {
    expect(Requests.refresh(1)).toEqual({ type: 'refresh', id: 1 });
    expect(Requests.purge(2, ['big', 'Out[3]'])).toEqual({
      type: 'purge',
      id: 2,
      names: ['big', 'Out[3]'],
      dry_run: false
    });
    expect(Requests.purge('p', ['m'], true).dry_run).toBe(true);
    expect(Requests.setDevice(4, 'cpu')).toEqual({
      type: 'set_device',
      id: 4,
      device: 'cpu'
    });
  });

  it('copies the names it is given', () => {
    const names = ['a'];
    const request = Requests.purge(1, names);
    names.push('b');
    expect(request.names).toEqual(['a']);
  });
});
