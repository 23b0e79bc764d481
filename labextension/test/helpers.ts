/**
 * Test helpers: sample protocol data, a recording kernel connection (the
 * frontend twin of ipywidgets' DummyComm: it keeps what the sidebar sends), a
 * sidebar following it, and queries of what the sidebar shows.
 */
import { Signal } from '@lumino/signaling';
import { Widget } from '@lumino/widgets';
import { expect } from 'vitest';

import { KernelChannel } from '../src/channel';
import type { ISessionLike } from '../src/channel';
import { SidebarModel } from '../src/model';
import { GpuMemSidebar } from '../src/sidebar';
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

/** A maker of sample data: a fresh `make()` with the `overrides` given on top. */
function sample<T>(make: () => T): (overrides?: Partial<T>) => T {
  return (overrides = {}) => ({ ...make(), ...overrides });
}

export const device = sample<IDeviceUsage>(() => ({
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
  notes: []
}));

export const holder = sample<IHolder>(() => ({
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
  purge: 'big'
}));

export const snapshot = sample<ISnapshot>(() => ({
  schema: 'jupyter_gpumem.snapshot/1',
  time: 1000,
  device: 'cpu',
  accelerator: false,
  partial: false,
  scan_seconds: 0.01,
  messages: [],
  devices: [device()],
  holders: [holder()],
  unattributed: { cpu: 0 }
}));

export const purgeResult = sample<IPurgeResult>(() => ({
  schema: 'jupyter_gpumem.purge/1',
  dry_run: false,
  names: ['big'],
  removed: ['big'],
  predicted: { cpu: 4 * MiB },
  before: { cpu: 34 * MiB },
  after: { cpu: 30 * MiB },
  freed: { cpu: 4 * MiB },
  still_held: [],
  messages: []
}));

export const W0 = 'tcp://127.0.0.1:40125';
export const W1 = 'tcp://127.0.0.1:44097';

/** A worker's host memory, as a worker reports it (no allocator counters). */
export const workerDevice = sample<IDeviceUsage>(() =>
  device({
    frameworks: [],
    allocated: null,
    reserved: null,
    non_framework: null,
    used_process: 300 * MiB,
    total: 1000 * MiB,
    free: 600 * MiB,
    attributed: 64 * MiB
  })
);

export const clusterWorker = sample<IClusterWorker>(() => ({
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
  seconds: 0.001
}));

/** A name whose `keys`, all in memory, hold `mib` MiB of one worker's host memory. */
export function onOneWorker(
  name: string,
  what: string,
  keys: number,
  worker: string,
  mib: number
) {
  return {
    name,
    what,
    keys,
    in_memory: keys,
    workers: { [worker]: { cpu: mib * MiB } },
    devices: { cpu: mib * MiB },
    unique: mib * MiB,
    total: mib * MiB,
    purge: name,
    summary: `${name} (${what}) ${mib}.0 MiB on worker ${worker} cpu`
  };
}

export const clusterHolder = sample<IClusterHolder>(() => ({
  ...onOneWorker('x', 'Future', 1, W0, 64),
  shared: 0,
  shared_with: [],
  not_in_memory: {},
  hidden: false,
  aliases: [],
  largest_key: 'ones-1a2b',
  largest_path: 'x'
}));

/** The `cluster` part of a snapshot: two workers, a Future and a persisted bag. */
export const cluster = sample<IClusterSnapshot>(() => ({
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
      devices: [workerDevice({ attributed: 16 * MiB, used_process: 200 * MiB })]
    })
  ],
  missing: {},
  held: { [W0]: { cpu: 64 * MiB }, [W1]: { cpu: 16 * MiB } },
  held_bytes: 80 * MiB,
  holders: [
    clusterHolder(),
    clusterHolder(onOneWorker('emb', 'persisted dask.bag, 4 chunks', 4, W1, 16))
  ],
  unclaimed: []
}));

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
  /** The notebook closed (its session context is disposed). */
  close(): void {
    this.isDisposed = true;
    this.disposed.emit();
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

export const $ = (root: HTMLElement, sel: string) =>
  root.querySelector(sel) as HTMLElement;
export const $$ = (root: HTMLElement, sel: string) =>
  Array.from(root.querySelectorAll(sel)) as HTMLElement[];

/** A device bar's segments as `[segment, width]`. */
export function segmentWidths(bar: HTMLElement): string[][] {
  return $$(bar, '.jp-GpuMem-seg').map(s => [
    s.className.split('seg-')[1],
    s.style.width
  ]);
}

/**
 * A host's bar is drawn at the scale of its process: the tracked tensors and
 * the rest of the process, of these widths, and says so in `text`.
 */
export function expectProcessScale(
  bar: HTMLElement,
  tracked: string,
  rest: string,
  text: string
): void {
  expect(segmentWidths(bar)).toEqual([
    ['allocated', tracked],
    ['non-framework', rest]
  ]);
  expect(bar.textContent).toContain(text);
}

const opened: Widget[] = [];

/** Dispose of the sidebars `openSidebar` made (a test file's `afterEach`). */
export function disposeSidebars(): void {
  while (opened.length) {
    opened.pop()!.dispose();
  }
}

/**
 * A sidebar following a notebook (none: `notebook` null) on a recording kernel:
 * `answer` is what the purge confirmation says (the questions are kept in
 * `asked`), `attach` puts it in the document, `comm()` is the kernel's newest
 * comm.
 */
export function openSidebar({
  answer = true,
  attach = true,
  notebook = 'demo.ipynb' as string | null,
  refreshInterval
}: {
  answer?: boolean;
  attach?: boolean;
  notebook?: string | null;
  refreshInterval?: number;
} = {}) {
  const model = new SidebarModel();
  const channel = new KernelChannel(model);
  const asked: [string[], number][] = [];
  const sidebar = new GpuMemSidebar({
    model,
    channel,
    confirmPurge: async (names, bytes) => {
      asked.push([names, bytes]);
      return answer;
    },
    refreshInterval
  });
  if (attach) {
    Widget.attach(sidebar, document.body);
  }
  opened.push(sidebar);
  const session = new RecordingSession();
  if (notebook !== null) {
    channel.follow(session, notebook);
  }
  const comm = () => session.kernel.lastComm;
  return { model, channel, sidebar, session, comm, asked };
}

export type SidebarCase = ReturnType<typeof openSidebar>;

/** The kernel says hello (the comm is open), for `device`. */
export function hello(comm: RecordingComm, device = 'auto'): void {
  comm.receive({ type: 'hello', version: '0.1.0', device });
}

/** The kernel says hello and sends `snap`; what the sidebar sent so far is forgotten. */
export function ready(
  ctx: SidebarCase,
  snap = snapshot(),
  device = 'auto'
): void {
  hello(ctx.comm(), device);
  ctx.comm().receive({ type: 'snapshot', snapshot: snap });
  ctx.comm().sent = [];
}
