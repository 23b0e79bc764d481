/**
 * Test helpers: sample protocol data and a recording kernel connection (the
 * frontend twin of ipywidgets' DummyComm: it keeps what the sidebar sends).
 */
import { Signal } from '@lumino/signaling';

import type { ISessionLike } from '../src/channel';
import type {
  IClusterHolder,
  IClusterSnapshot,
  IClusterWorker,
  IDeviceUsage,
  IHolder,
  IPurgeResult,
  ISnapshot
} from '../src/protocol';

export const MiB = 1 << 20;

export function device(overrides: Partial<IDeviceUsage> = {}): IDeviceUsage {
  return {
    id: 'cpu',
    kind: 'cpu',
    name: 'host',
    total: 100 * MiB,
    used_all: null,
    used_process: 30 * MiB,
    other_processes: null,
    free: 60 * MiB,
    frameworks: [
      {
        name: 'torch',
        allocated: 4 * MiB,
        reserved: 4 * MiB,
        peak: null,
        pool: null,
        note: null
      }
    ],
    allocated: 4 * MiB,
    reserved: 4 * MiB,
    non_framework: 26 * MiB,
    fragmentation: null,
    attributed: 4 * MiB,
    notes: [],
    ...overrides
  };
}

export function holder(overrides: Partial<IHolder> = {}): IHolder {
  return {
    name: 'big',
    label: 'big',
    hidden: false,
    aliases: [],
    type: 'Tensor',
    unique: 4 * MiB,
    shared: 0,
    total: 4 * MiB,
    devices: { cpu: 4 * MiB },
    tensors: 1,
    largest_path: 'big',
    largest_bytes: 4 * MiB,
    shared_with: [],
    hint: null,
    purge: 'big',
    ...overrides
  };
}

export function snapshot(overrides: Partial<ISnapshot> = {}): ISnapshot {
  return {
    schema: 'jupyter_gpumem.snapshot/1',
    time: 1000,
    device: 'cpu',
    accelerator: false,
    partial: false,
    scan_seconds: 0.01,
    messages: [],
    devices: [device()],
    holders: [holder()],
    unattributed: { cpu: 0 },
    ...overrides
  };
}

export function purgeResult(
  overrides: Partial<IPurgeResult> = {}
): IPurgeResult {
  return {
    schema: 'jupyter_gpumem.purge/1',
    dry_run: false,
    names: ['big'],
    removed: ['big'],
    predicted: { cpu: 4 * MiB },
    before: { cpu: 34 * MiB },
    after: { cpu: 30 * MiB },
    freed: { cpu: 4 * MiB },
    still_held: [],
    messages: [],
    ...overrides
  };
}

export const W0 = 'tcp://127.0.0.1:40125';
export const W1 = 'tcp://127.0.0.1:44097';

/** A worker's host memory, as a worker reports it (no allocator counters). */
export function workerDevice(
  overrides: Partial<IDeviceUsage> = {}
): IDeviceUsage {
  return device({
    frameworks: [],
    allocated: null,
    reserved: null,
    non_framework: null,
    used_process: 300 * MiB,
    total: 1000 * MiB,
    free: 600 * MiB,
    attributed: 64 * MiB,
    ...overrides
  });
}

export function clusterWorker(
  overrides: Partial<IClusterWorker> = {}
): IClusterWorker {
  return {
    address: W0,
    name: '0',
    host: 'vm',
    pid: 4242,
    devices: [workerDevice()],
    keys: 1,
    tracked: { cpu: 64 * MiB },
    spilled: {},
    visible_devices: null,
    partial: false,
    reasons: [],
    seconds: 0.001,
    ...overrides
  };
}

export function clusterHolder(
  overrides: Partial<IClusterHolder> = {}
): IClusterHolder {
  return {
    name: 'x',
    what: 'Future',
    keys: 1,
    in_memory: 1,
    workers: { [W0]: { cpu: 64 * MiB } },
    devices: { cpu: 64 * MiB },
    unique: 64 * MiB,
    shared: 0,
    total: 64 * MiB,
    shared_with: [],
    not_in_memory: {},
    hidden: false,
    aliases: [],
    purge: 'x',
    largest_key: 'ones-1a2b',
    largest_path: 'x',
    summary: `x (Future) 64.0 MiB on worker ${W0} cpu`,
    ...overrides
  };
}

/** The `cluster` part of a snapshot: two workers, a Future and a persisted bag. */
export function cluster(
  overrides: Partial<IClusterSnapshot> = {}
): IClusterSnapshot {
  return {
    schema: 'jupyter_gpumem.cluster/1',
    time: 1000,
    scheduler: 'tcp://127.0.0.1:8786',
    client: 'Client-1',
    device: 'cpu',
    partial: false,
    messages: [],
    seconds: 0.04,
    workers: [
      clusterWorker(),
      clusterWorker({
        address: W1,
        name: '1',
        keys: 4,
        devices: [
          workerDevice({ attributed: 16 * MiB, used_process: 200 * MiB })
        ]
      })
    ],
    missing: {},
    held: { [W0]: { cpu: 64 * MiB }, [W1]: { cpu: 16 * MiB } },
    held_bytes: 80 * MiB,
    holders: [
      clusterHolder(),
      clusterHolder({
        name: 'emb',
        what: 'persisted dask.bag, 4 chunks',
        keys: 4,
        in_memory: 4,
        workers: { [W1]: { cpu: 16 * MiB } },
        devices: { cpu: 16 * MiB },
        unique: 16 * MiB,
        total: 16 * MiB,
        purge: 'emb',
        summary: `emb (persisted dask.bag, 4 chunks) 16.0 MiB on worker ${W1} cpu`
      })
    ],
    unclaimed: [],
    ...overrides
  };
}

function done<T>(value: T): { done: Promise<T> } {
  return { done: Promise.resolve(value) };
}

/** A comm that records what the sidebar sends. */
export class RecordingComm {
  constructor(readonly targetName: string) {}
  commId = `comm-${RecordingComm.count++}`;
  static count = 0;
  opened: unknown[] = [];
  sent: any[] = [];
  closed = false;
  isDisposed = false;
  onMsg: ((msg: any) => void) | null = null;
  onClose: ((msg: any) => void) | null = null;

  open(data: unknown) {
    this.opened.push(data);
    return done(undefined);
  }
  send(data: unknown) {
    this.sent.push(data);
    return done(undefined);
  }
  close() {
    this.closed = true;
    this.onClose?.({ content: { comm_id: this.commId, data: {} } });
    this.isDisposed = true;
    return done(undefined);
  }
  /** A message from the kernel. */
  receive(data: unknown): void {
    this.onMsg?.({ content: { comm_id: this.commId, data } });
  }
  /** The kernel closes the comm (no such target, or unload). */
  closeFromKernel(): void {
    this.onClose?.({ content: { comm_id: this.commId, data: {} } });
    this.isDisposed = true;
  }
}

/** A kernel connection that records comms and executions. */
export class RecordingKernel {
  constructor(readonly id = 'kernel-1') {}
  status = 'idle';
  comms: RecordingComm[] = [];
  executed: any[] = [];
  executeReply: any = {
    status: 'ok',
    execution_count: null,
    user_expressions: {}
  };

  createComm(target: string) {
    const comm = new RecordingComm(target);
    this.comms.push(comm);
    return comm as any;
  }
  requestExecute(content: unknown) {
    this.executed.push(content);
    return { done: Promise.resolve({ content: this.executeReply }) } as any;
  }
  get lastComm(): RecordingComm {
    return this.comms[this.comms.length - 1];
  }
}

/** A session context with real signals around a recording kernel. */
export class RecordingSession implements ISessionLike {
  constructor(kernel: RecordingKernel | null = new RecordingKernel()) {
    this.session = kernel ? { kernel: kernel as any } : null;
  }
  session: { kernel: any } | null;
  kernelChanged = new Signal<this, unknown>(this);
  statusChanged = new Signal<this, any>(this);
  iopubMessage = new Signal<this, any>(this);
  disposed = new Signal<this, void>(this);
  isDisposed = false;

  get kernel(): RecordingKernel {
    return this.session!.kernel as RecordingKernel;
  }
  setStatus(status: string): void {
    if (this.session?.kernel) {
      this.session.kernel.status = status;
    }
    this.statusChanged.emit(status);
  }
  executeInput(): void {
    this.iopubMessage.emit({
      header: { msg_type: 'execute_input' },
      content: {}
    });
  }
  changeKernel(kernel: RecordingKernel | null): void {
    this.session = kernel ? { kernel: kernel as any } : null;
    this.kernelChanged.emit({
      name: 'kernel',
      oldValue: null,
      newValue: kernel
    });
  }
}

/** Let pending promise callbacks run. */
export async function flush(): Promise<void> {
  for (let i = 0; i < 5; i++) {
    await Promise.resolve();
  }
}
