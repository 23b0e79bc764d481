import { afterEach, describe, expect, it } from 'vitest';

import { DEFAULT_WARN_SHARE } from '../src/constants';
import { applySettings, readSettings } from '../src/settings';
import { disposeSidebars, hello, openSidebar } from './helpers';
import schema from '../schema/sidebar.json';

afterEach(disposeSidebars);

describe('settings', () => {
  it('has a schema whose defaults are the built-in ones', () => {
    expect(schema.properties.refreshInterval.default).toBe(15);
    expect(schema.properties.defaultDevice.default).toBe('auto');
    expect(readSettings({})).toEqual({
      refreshInterval: 15,
      defaultDevice: 'auto',
      warnAt: 0.9
    });
    expect(readSettings({ refreshInterval: 0, defaultDevice: ' ' })).toEqual({
      refreshInterval: 15,
      defaultDevice: 'auto',
      warnAt: 0.9
    });
    const pattern = new RegExp(schema.properties.defaultDevice.pattern);
    for (const ok of ['auto', 'all', 'cpu', 'cuda', 'cuda:1', 'mps']) {
      expect(pattern.test(ok)).toBe(true);
    }
    expect(pattern.test('rm -rf')).toBe(false);
  });

  it('applies the refresh interval and the default device live', () => {
    const { model, channel, sidebar, session } = openSidebar({
      answer: false,
      attach: false
    });
    hello(session.kernel.lastComm);
    session.kernel.lastComm.sent = [];
    const apply = (refreshInterval: number, defaultDevice: string) =>
      applySettings(
        { refreshInterval, defaultDevice, warnAt: DEFAULT_WARN_SHARE },
        sidebar,
        channel
      );

    apply(3, 'cpu');
    expect(sidebar.poll.frequency.interval).toBe(3000);
    expect(model.device).toBe('cpu');
    expect(session.kernel.lastComm.sent).toEqual([
      { type: 'set_device', id: 2, device: 'cpu' }
    ]);

    // the user picks another device; a change of the interval alone keeps it
    channel.setDevice('all');
    apply(5, 'cpu');
    expect(sidebar.poll.frequency.interval).toBe(5000);
    expect(model.device).toBe('all');
  });
});
