import { describe, expect, it, vi } from 'vitest';

import { KernelChannel } from '../src/channel';
import { COMM_TARGET, LOAD_EXTENSION_CODE } from '../src/constants';
import { SidebarModel } from '../src/model';
import {
  device,
  flush,
  RecordingKernel,
  RecordingSession,
  snapshot
} from './helpers';

function setUp(session = new RecordingSession()) {
  const model = new SidebarModel();
  const channel = new KernelChannel(model);
  channel.follow(session, 'a.ipynb');
  return { model, channel, session };
}

function hello(session: RecordingSession): void {
  session.kernel.lastComm.receive({
    type: 'hello',
    version: '0.1.0',
    device: 'auto'
  });
}

describe('KernelChannel', () => {
  it('opens a comm on the target and asks for its device after hello', () => {
    const { model, session } = setUp();
    expect(model.state).toBe('connecting');
    const comm = session.kernel.lastComm;
    expect(comm.targetName).toBe(COMM_TARGET);
    expect(comm.opened).toEqual([{}]);
    hello(session);
    expect(model.state).toBe('ready');
    expect(comm.sent).toEqual([{ type: 'set_device', id: 1, device: 'auto' }]);
  });

  it('feeds kernel messages to the model and reports malformed ones', () => {
    const { model, session } = setUp();
    hello(session);
    session.kernel.lastComm.receive({ type: 'snapshot', snapshot: snapshot() });
    expect(model.snapshot?.holders[0].name).toBe('big');
    session.kernel.lastComm.receive({
      type: 'snapshot',
      snapshot: { schema: 'x' }
    });
    expect(model.error).toContain('not a snapshot/1');
    expect(model.snapshot?.holders[0].name).toBe('big');
  });

  it('sends refresh, purge and set_device only on an open link', () => {
    const { model, channel, session } = setUp();
    expect(channel.refresh()).toBe(false);
    expect(channel.purge(['big'])).toBe(false);
    hello(session);
    const comm = session.kernel.lastComm;
    comm.sent = [];
    expect(channel.refresh()).toBe(true);
    expect(channel.purge([])).toBe(false);
    expect(channel.purge(['big', 'Out[2]'])).toBe(true);
    channel.setDevice('cpu');
    expect(comm.sent).toEqual([
      { type: 'refresh', id: 2 },
      { type: 'purge', id: 3, names: ['big', 'Out[2]'], dry_run: false },
      { type: 'set_device', id: 4, device: 'cpu' }
    ]);
    expect(model.device).toBe('cpu');
  });

  it('refreshes from the poll only while the kernel is idle', () => {
    const { channel, session } = setUp();
    hello(session);
    const comm = session.kernel.lastComm;
    comm.sent = [];
    session.kernel.status = 'busy';
    expect(channel.refreshIfIdle()).toBe(false);
    session.kernel.status = 'idle';
    expect(channel.refreshIfIdle()).toBe(true);
    expect(comm.sent.map(m => m.type)).toEqual(['refresh']);
  });

  it('shows not-loaded when the kernel closes the comm at once', () => {
    const { model, session } = setUp();
    session.kernel.lastComm.closeFromKernel();
    expect(model.state).toBe('not-loaded');
  });

  it('loads the extension silently on request, then reconnects', async () => {
    const { model, channel, session } = setUp();
    session.kernel.lastComm.closeFromKernel();
    await channel.loadExtension();
    expect(session.kernel.executed).toEqual([
      {
        code: LOAD_EXTENSION_CODE,
        silent: true,
        store_history: false,
        allow_stdin: false,
        stop_on_error: false
      }
    ]);
    expect(session.kernel.comms.length).toBe(2);
    expect(model.state).toBe('connecting');
    hello(session);
    expect(model.state).toBe('ready');
  });

  it('reports a failed load in one line and stays not-loaded', async () => {
    const { model, channel, session } = setUp();
    session.kernel.lastComm.closeFromKernel();
    session.kernel.executeReply = {
      status: 'error',
      ename: 'ModuleNotFoundError',
      evalue: "No module named 'jupyter_gpumem'",
      traceback: []
    };
    await channel.loadExtension();
    expect(model.state).toBe('not-loaded');
    expect(model.error).toBe(
      "Loading failed: ModuleNotFoundError: No module named 'jupyter_gpumem'"
    );
    expect(session.kernel.comms.length).toBe(1);
  });

  it('never runs code in the kernel unless asked', () => {
    const { session } = setUp();
    session.kernel.lastComm.closeFromKernel();
    session.executeInput();
    session.setStatus('busy');
    session.setStatus('idle');
    expect(session.kernel.executed).toEqual([]);
  });

  it('tries again after a cell ran in a kernel that had not loaded it', () => {
    const { model, session } = setUp();
    session.kernel.lastComm.closeFromKernel();
    // its own comm_open makes the kernel busy then idle: no retry loop
    session.setStatus('busy');
    session.setStatus('idle');
    expect(session.kernel.comms.length).toBe(1);
    session.executeInput();
    session.setStatus('busy');
    session.setStatus('idle');
    expect(session.kernel.comms.length).toBe(2);
    expect(model.state).toBe('connecting');
  });

  it('reconnects after a kernel restart', () => {
    const { model, session } = setUp();
    hello(session);
    session.kernel.lastComm.receive({ type: 'snapshot', snapshot: snapshot() });
    session.setStatus('restarting');
    expect(model.state).toBe('restarting');
    expect(model.snapshot).toBeNull();
    expect(session.kernel.comms.length).toBe(1);
    session.setStatus('starting');
    session.setStatus('idle');
    expect(session.kernel.comms.length).toBe(2);
    // messages on the old comm are ignored
    session.kernel.comms[0].receive({ type: 'snapshot', snapshot: snapshot() });
    expect(model.snapshot).toBeNull();
  });

  it('shows a dead kernel and comes back when it does', () => {
    const { model, session } = setUp();
    hello(session);
    session.setStatus('dead');
    expect(model.state).toBe('dead');
    session.setStatus('idle');
    expect(model.state).toBe('connecting');
  });

  it('follows a kernel change and closes the old comm', () => {
    const { model, session } = setUp();
    hello(session);
    const old = session.kernel;
    const next = new RecordingKernel('kernel-2');
    session.changeKernel(next);
    expect(old.lastComm.isDisposed || old.lastComm.closed).toBe(false);
    expect(next.comms.length).toBe(1);
    expect(model.state).toBe('connecting');
    session.changeKernel(null);
    expect(model.state).toBe('no-kernel');
  });

  it('keeps each comm open across focus changes, with its history', () => {
    const { model, channel, session } = setUp();
    hello(session);
    session.kernel.lastComm.receive({
      type: 'devices',
      time: 1,
      devices: [device()]
    });
    const other = new RecordingSession();
    channel.follow(other, 'b.ipynb');
    expect(session.kernel.lastComm.closed).toBe(false);
    expect(model.kernelLabel).toBe('b.ipynb');
    expect(model.state).toBe('connecting');
    // the first kernel's readings still arrive, into its own view
    session.kernel.lastComm.receive({
      type: 'devices',
      time: 2,
      devices: [device()]
    });
    expect(model.timeline.size).toBe(0);
    channel.follow(session, 'a.ipynb');
    expect(model.state).toBe('ready');
    expect(model.timeline.get('cpu')!.map(p => p.time)).toEqual([1, 2]);
    expect(session.kernel.comms.length).toBe(1);
    channel.follow(null, '');
    expect(model.state).toBe('no-kernel');
    expect(other.kernel.lastComm.closed).toBe(false);
    expect(channel.openComms).toBe(2);
    // a notebook closed: its comm closes
    session.close();
    expect(session.kernel.lastComm.closed).toBe(true);
    expect(channel.openComms).toBe(1);
  });

  it('shows a request with no answer after 10 s, with a retry', () => {
    vi.useFakeTimers();
    try {
      const { model, channel, session } = setUp();
      hello(session);
      const comm = session.kernel.lastComm;
      comm.sent = [];
      expect(channel.purge(['big'])).toBe(true);
      vi.advanceTimersByTime(9000);
      expect(model.noAnswer).toBeNull();
      vi.advanceTimersByTime(1500);
      expect(model.noAnswer?.request.type).toBe('purge');
      expect(channel.retry()).toBe(true);
      expect(comm.sent.map(m => [m.type, m.names])).toEqual([
        ['purge', ['big']],
        ['purge', ['big']]
      ]);
      expect(model.noAnswer).toBeNull();
      // an answer in time: nothing shown
      const id = comm.sent[1].id;
      comm.receive({ type: 'error', message: 'x', reply_to: id });
      vi.advanceTimersByTime(11000);
      expect(model.noAnswer).toBeNull();
    } finally {
      vi.useRealTimers();
    }
  });

  it('shows a queued purge with cancel, and never times it out', () => {
    vi.useFakeTimers();
    try {
      const { model, channel, session } = setUp();
      session.kernel.lastComm.receive({
        type: 'hello',
        version: '0.2.0',
        device: 'auto',
        busy: true
      });
      expect(model.cellRunning).toBe(true);
      const comm = session.kernel.lastComm;
      comm.receive({ type: 'snapshot', snapshot: snapshot(), reply_to: 1 });
      comm.sent = [];
      channel.purge(['big']);
      const id = comm.sent[0].id;
      comm.receive({
        type: 'queued',
        reply_to: id,
        request: 'purge',
        message: 'queued: runs when the cell ends'
      });
      vi.advanceTimersByTime(30000);
      expect(model.noAnswer).toBeNull();
      expect(model.pending.map(p => [p.id, p.queued])).toEqual([[id, true]]);
      channel.cancel(id);
      expect(comm.sent[1]).toMatchObject({ type: 'cancel', request: id });
      comm.receive({
        type: 'cancelled',
        reply_to: comm.sent[1].id,
        request: id
      });
      expect(model.pending).toEqual([]);
    } finally {
      vi.useRealTimers();
    }
  });

  it('splits a purge of more than 256 names for an older kernel, one result', () => {
    const { model, channel, session } = setUp();
    hello(session);
    const comm = session.kernel.lastComm;
    comm.receive({ type: 'snapshot', snapshot: snapshot(), reply_to: 1 });
    comm.sent = [];
    const names = Array.from({ length: 300 }, (_, i) => `Out[${i + 1}]`);
    expect(channel.purge(names)).toBe(true);
    expect(comm.sent.map(m => m.names.length)).toEqual([256, 44]);
    const result = (part: string[]) => ({
      schema: 'jupyter_gpumem.purge/1',
      dry_run: false,
      names: part,
      removed: part,
      predicted: { cpu: part.length },
      before: {},
      after: {},
      freed: { cpu: part.length },
      still_held: [],
      messages: []
    });
    comm.receive({
      type: 'purge_result',
      result: result(comm.sent[0].names),
      reply_to: comm.sent[0].id
    });
    expect(model.lastPurge).toBeNull();
    comm.receive({
      type: 'purge_result',
      result: result(comm.sent[1].names),
      reply_to: comm.sent[1].id
    });
    expect(model.lastPurge?.removed.length).toBe(300);
    expect(model.lastPurge?.freed).toEqual({ cpu: 300 });
    expect(model.pending).toEqual([]);
  });

  it("takes a newer kernel's timeline from its hello", () => {
    const { model, session } = setUp();
    session.kernel.lastComm.receive({
      type: 'hello',
      version: '0.2.0',
      device: 'auto',
      busy: false,
      timeline: [
        {
          time: 10,
          devices: { cpu: { allocated: null, reserved: null, used_process: 5 } }
        },
        {
          time: 11,
          devices: { cpu: { allocated: null, reserved: null, used_process: 6 } }
        }
      ]
    });
    expect(model.timeline.get('cpu')!.map(p => p.used)).toEqual([5, 6]);
    expect(model.modern).toBe(true);
  });

  it('handles a session without a kernel', async () => {
    const session = new RecordingSession(null);
    const { model, channel } = setUp(session);
    expect(model.state).toBe('no-kernel');
    await channel.loadExtension();
    expect(model.state).toBe('no-kernel');
    session.changeKernel(new RecordingKernel());
    expect(model.state).toBe('connecting');
    await flush();
  });
});
