/**
 * The snapshot schema, the comm protocol and the server extension's answers
 * of docs/PROTOCOL.md, as types, with checkers for what arrives from the
 * kernel and the server and builders for what the sidebar sends the kernel.
 */
import {
  CLUSTER_SCHEMA,
  KERNELS_SCHEMA,
  PURGE_SCHEMA,
  SNAPSHOT_SCHEMA
} from './constants';

/** Bytes per device id, e.g. `{"cuda:0": 1048576}`. */
export type ByteMap = { [device: string]: number };

/** One framework's counters on one device. */
export interface IFrameworkUsage {
  name: string;
  allocated: number | null;
  reserved: number | null;
  peak: number | null;
  pool: number | null;
  note: string | null;
}

/** One device's memory figures. */
export interface IDeviceUsage {
  id: string;
  kind: string;
  name: string | null;
  nvml_index?: number | null;
  uuid?: string | null;
  total: number | null;
  used_all: number | null;
  used_process: number | null;
  other_processes: number | null;
  free: number | null;
  frameworks: IFrameworkUsage[];
  allocated: number | null;
  reserved: number | null;
  non_framework: number | null;
  fragmentation: {
    free_in_reserved: number | null;
    largest_free_block: number | null;
  } | null;
  attributed: number | null;
  notes: string[];
}

/** A notebook name (or hidden holder) and the memory it keeps alive. */
export interface IHolder {
  name: string;
  label: string;
  hidden: boolean;
  aliases: string[];
  type: string;
  unique: number;
  shared: number;
  total: number;
  devices: ByteMap;
  tensors: number;
  largest_path: string | null;
  largest_bytes: number | null;
  shared_with: string[];
  hint: string | null;
  purge: string | null;
}

/** One Dask worker of a cluster part: where it runs and its devices. */
export interface IClusterWorker {
  address: string;
  name: string | null;
  host: string | null;
  pid: number | null;
  devices: IDeviceUsage[];
  keys: number;
  tracked: ByteMap;
  spilled: ByteMap;
  visible_devices: string | null;
  partial: boolean;
  reasons: string[];
  seconds: number;
}

/** A notebook name that keeps cluster keys alive, and their bytes per worker. */
export interface IClusterHolder {
  name: string;
  what: string;
  keys: number;
  in_memory: number;
  workers: { [worker: string]: ByteMap };
  devices: ByteMap;
  unique: number;
  shared: number;
  total: number;
  shared_with: string[];
  not_in_memory: { [state: string]: number };
  hidden: boolean;
  aliases: string[];
  purge: string | null;
  largest_key: string | null;
  largest_path: string | null;
  summary: string;
}

/** A key in worker memory that no name of the notebook holds, and who does. */
export interface IUnclaimedKey {
  key: string;
  worker: string;
  devices: ByteMap;
  bytes: number;
  sizeof: number;
  held_by: string[];
  state: string | null;
}

/** The optional `cluster` part of a snapshot: a Dask cluster the notebook drives. */
export interface IClusterSnapshot {
  schema: string;
  time: number;
  scheduler: string | null;
  client: string;
  device: string;
  partial: boolean;
  messages: string[];
  seconds: number;
  workers: IClusterWorker[];
  missing: { [worker: string]: string };
  held: { [worker: string]: ByteMap };
  held_bytes: number;
  holders: IClusterHolder[];
  unclaimed: IUnclaimedKey[];
  /** Keys held by no name beyond those listed: how many, and their bytes. */
  unclaimed_left_off?: { keys: number; bytes: number };
}

/** What `jupyter_gpumem.snapshot()` returns, as JSON. */
export interface ISnapshot {
  schema: string;
  time: number;
  device: string;
  accelerator: boolean;
  partial: boolean;
  scan_seconds: number;
  messages: string[];
  devices: IDeviceUsage[];
  holders: IHolder[];
  unattributed: { [device: string]: number | null } | null;
  /** Present when a Dask client is connected (docs/PROTOCOL.md). */
  cluster?: IClusterSnapshot | null;
  /**
   * The cell this snapshot follows, in epoch seconds, when the kernel tells
   * (optional; the sidebar also times cells from the kernel's messages).
   */
  cell?: { start: number; end: number } | null;
  /** Whether a cell was running when the snapshot was taken (newer kernels). */
  cell_running?: boolean;
}

/** What `jupyter_gpumem.purge()` returns, as JSON. */
export interface IPurgeResult {
  schema: string;
  dry_run: boolean;
  names: string[];
  removed: string[];
  predicted: ByteMap;
  before: ByteMap;
  after: ByteMap;
  freed: ByteMap;
  still_held: { by: string; path: string | null; bytes: number }[];
  messages: string[];
}

/** Request ids are echoed by the kernel as `reply_to`. */
export type RequestId = number | string;

/** One reading of one device in a `hello`'s timeline. */
export interface ITimelineReading {
  allocated: number | null;
  reserved: number | null;
  used_process: number | null;
}

export interface IHelloMessage {
  type: 'hello';
  version: string | null;
  device: string;
  /** Whether a cell runs (newer kernels; absent: an older kernel side). */
  busy?: boolean;
  /** The kernel's readings so far, oldest first (newer kernels). */
  timeline?: { time: number; devices: { [id: string]: ITimelineReading } }[];
  reply_to?: RequestId | null;
}

export interface IDevicesMessage {
  type: 'devices';
  time: number;
  devices: IDeviceUsage[];
  /** Whether a cell runs now (newer kernels). */
  cell_running?: boolean;
}

/** A request that reads or changes the namespace waits for the running cell. */
export interface IQueuedMessage {
  type: 'queued';
  reply_to: RequestId;
  request: string;
  message: string;
}

/** A queued request was cancelled. */
export interface ICancelledMessage {
  type: 'cancelled';
  reply_to: RequestId;
  request: RequestId;
}

export interface ISnapshotMessage {
  type: 'snapshot';
  snapshot: ISnapshot;
  reply_to?: RequestId | null;
}

export interface IPurgeResultMessage {
  type: 'purge_result';
  result: IPurgeResult;
  reply_to?: RequestId | null;
}

export interface IErrorMessage {
  type: 'error';
  message: string;
  reply_to?: RequestId | null;
}

/** Every message the kernel sends to the sidebar. */
export type KernelMessage =
  | IHelloMessage
  | IDevicesMessage
  | ISnapshotMessage
  | IPurgeResultMessage
  | IErrorMessage
  | IQueuedMessage
  | ICancelledMessage;

/** Messages the sidebar sends to the kernel. */
export interface IRefreshRequest {
  type: 'refresh';
  id: RequestId;
}

export interface IPurgeRequest {
  type: 'purge';
  id: RequestId;
  names: string[];
  dry_run: boolean;
}

export interface ISetDeviceRequest {
  type: 'set_device';
  id: RequestId;
  device: string;
}

/** A ping (the kernel answers `hello`). */
export interface IHelloRequest {
  type: 'hello';
  id: RequestId;
}

/** Cancel a queued request (`request`: its id). */
export interface ICancelRequest {
  type: 'cancel';
  id: RequestId;
  request: RequestId;
}

export type SidebarRequest =
  | IRefreshRequest
  | IPurgeRequest
  | ISetDeviceRequest
  | IHelloRequest
  | ICancelRequest;

// -- the server extension (docs/PROTOCOL.md, "Server extension") --

/** A process on a GPU, as the server names it (`GpuProcess` and its device). */
export interface IOtherProcess {
  device: string;
  pid: number;
  bytes: number | null;
  /** `orphan`, `other_user`, `kernel`, `kernel_child`, `own`, ... */
  relation: string;
  label: string;
  user: string | null;
  command: string;
  path: string | null;
  purgeable: boolean;
}

/** One GPU as the server reads it (NVML), with what it cannot name. */
export interface IServerDevice {
  device: string;
  nvml_index: number | null;
  uuid: string | null;
  name: string | null;
  total: number | null;
  used: number | null;
  hidden: number;
  hidden_bytes: number;
}

/** One kernel of the server's answer. */
export interface IServerKernel {
  id: string;
  name: string | null;
  /** Its first session's notebook or console path; null: no session. */
  path: string | null;
  type: string | null;
  /** Null where the server does not run the kernel itself (`pid_note` says). */
  pid: number | null;
  pid_note: string | null;
  /** Every descendant, GPU or not. */
  children: number[];
  /** Bytes per GPU of the kernel and its descendants. */
  gpu: { [device: string]: number };
  gpu_bytes: number;
  execution_state: string | null;
  /** Resident memory of the kernel and its children (newer servers). */
  host?: { rss: number | null } | null;
  sessions?: { path: string | null; type: string | null; name?: string }[];
  /** Its processes on the GPUs. */
  processes?: Pick<
    IOtherProcess,
    'pid' | 'device' | 'bytes' | 'relation' | 'label' | 'command'
  >[];
}

/** The answer of `GET api/gpumem/kernels` (`jupyter_gpumem.kernels/1`). */
export interface IServerKernels {
  schema: string;
  version?: string;
  /** When the readings were taken, epoch seconds. */
  time?: number;
  server_pid?: number;
  user?: string | null;
  /** False: no GPU, or no NVML (`message` says). */
  gpu: boolean;
  message: string | null;
  devices?: IServerDevice[];
  /** Largest GPU use first. */
  kernels: IServerKernel[];
  /** On the GPUs, no kernel of the server nor a kernel's child. */
  others: IOtherProcess[];
  /** Those of `others` that are orphans (older servers: absent). */
  orphans: IOtherProcess[];
}

/** The answer of `POST api/gpumem/orphans` (an `OrphanPurge`). */
export interface IOrphanPurge {
  dry_run?: boolean;
  grace?: number;
  targets?: {
    pid: number;
    bytes: number | null;
    devices: ByteMap;
    user: string | null;
    command: string;
    path: string | null;
    label: string;
  }[];
  /** One signal each, or what became of it (`result` `ended` once gone). */
  steps?: { pid: number; signal: string; result: string; seconds?: number }[];
  before?: ByteMap;
  after?: ByteMap;
  freed?: ByteMap;
  messages?: string[];
  seconds?: number;
}

/** Result of checking one message from the kernel. */
export type Parsed =
  { ok: true; message: KernelMessage } | { ok: false; reason: string };

function isObject(value: unknown): value is { [key: string]: unknown } {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function isRequestId(value: unknown): value is RequestId {
  return typeof value === 'number' || typeof value === 'string';
}

function isDevice(value: unknown): value is IDeviceUsage {
  return (
    isObject(value) &&
    typeof value.id === 'string' &&
    Array.isArray(value.frameworks ?? [])
  );
}

function isHolder(value: unknown): value is IHolder {
  return (
    isObject(value) &&
    typeof value.name === 'string' &&
    typeof value.unique === 'number' &&
    typeof value.total === 'number' &&
    (value.purge === null || typeof value.purge === 'string')
  );
}

function isSnapshot(value: unknown): value is ISnapshot {
  return (
    isObject(value) &&
    value.schema === SNAPSHOT_SCHEMA &&
    Array.isArray(value.devices) &&
    value.devices.every(isDevice) &&
    Array.isArray(value.holders) &&
    value.holders.every(isHolder)
  );
}

function isClusterWorker(value: unknown): value is IClusterWorker {
  return (
    isObject(value) &&
    typeof value.address === 'string' &&
    Array.isArray(value.devices) &&
    value.devices.every(isDevice)
  );
}

function isClusterHolder(value: unknown): value is IClusterHolder {
  return (
    isObject(value) &&
    typeof value.name === 'string' &&
    typeof value.total === 'number' &&
    isObject(value.workers)
  );
}

function isUnclaimedKey(value: unknown): value is IUnclaimedKey {
  return (
    isObject(value) &&
    typeof value.key === 'string' &&
    typeof value.worker === 'string' &&
    Array.isArray(value.held_by ?? [])
  );
}

/** Whether a snapshot's `cluster` part is one this sidebar can show. */
export function isClusterSnapshot(value: unknown): value is IClusterSnapshot {
  return (
    isObject(value) &&
    value.schema === CLUSTER_SCHEMA &&
    Array.isArray(value.workers) &&
    value.workers.every(isClusterWorker) &&
    Array.isArray(value.holders) &&
    value.holders.every(isClusterHolder) &&
    (value.unclaimed === undefined ||
      (Array.isArray(value.unclaimed) &&
        value.unclaimed.every(isUnclaimedKey))) &&
    (value.missing === undefined || isObject(value.missing))
  );
}

/**
 * The snapshot with a `cluster` part this sidebar cannot show (another schema, a
 * malformed one) left out, and said so in its messages: the local part stands.
 */
function withKnownCluster(snapshot: ISnapshot): ISnapshot {
  const cluster: unknown = snapshot.cluster;
  if (cluster === undefined || cluster === null || isClusterSnapshot(cluster)) {
    return snapshot;
  }
  const schema =
    isObject(cluster) && typeof cluster.schema === 'string'
      ? cluster.schema
      : '?';
  return {
    ...snapshot,
    cluster: null,
    messages: [
      ...(snapshot.messages ?? []),
      `cluster part not shown: not a ${CLUSTER_SCHEMA} (${schema})`
    ]
  };
}

function isPurgeResult(value: unknown): value is IPurgeResult {
  return (
    isObject(value) &&
    value.schema === PURGE_SCHEMA &&
    Array.isArray(value.removed) &&
    isObject(value.freed)
  );
}

/**
 * Check one message from the kernel against the protocol.
 *
 * Unknown types and malformed fields give `ok: false` with a reason, so a
 * newer or broken kernel side never breaks the sidebar.
 */
export function parseKernelMessage(data: unknown): Parsed {
  if (!isObject(data) || typeof data.type !== 'string') {
    return { ok: false, reason: 'message without a string "type"' };
  }
  const bad = (what: string): Parsed => ({
    ok: false,
    reason: `malformed "${data.type}" message: ${what}`
  });
  switch (data.type) {
    case 'hello':
      return typeof data.device === 'string'
        ? { ok: true, message: data as unknown as IHelloMessage }
        : bad('no device');
    case 'devices':
      return Array.isArray(data.devices) && data.devices.every(isDevice)
        ? { ok: true, message: data as unknown as IDevicesMessage }
        : bad('devices is not a list of devices');
    case 'snapshot': {
      if (!isSnapshot(data.snapshot)) {
        return bad('not a snapshot/1');
      }
      const snapshot = withKnownCluster(data.snapshot);
      return {
        ok: true,
        message: (snapshot === data.snapshot
          ? data
          : { ...data, snapshot }) as unknown as ISnapshotMessage
      };
    }
    case 'purge_result':
      return isPurgeResult(data.result)
        ? { ok: true, message: data as unknown as IPurgeResultMessage }
        : bad('not a purge/1 result');
    case 'error':
      return typeof data.message === 'string'
        ? { ok: true, message: data as unknown as IErrorMessage }
        : bad('no message');
    case 'queued':
      return isRequestId(data.reply_to)
        ? { ok: true, message: data as unknown as IQueuedMessage }
        : bad('no reply_to');
    case 'cancelled':
      return isRequestId(data.reply_to) && isRequestId(data.request)
        ? { ok: true, message: data as unknown as ICancelledMessage }
        : bad('no reply_to or request');
    default:
      return { ok: false, reason: `unknown message type "${data.type}"` };
  }
}

/**
 * Checks the shape of the server's `api/gpumem/kernels` answer; throws on
 * anything else. An older server's answer without `orphans` gets an empty list.
 */
export function parseServerKernels(data: unknown): IServerKernels {
  const d = data as IServerKernels;
  if (
    !isObject(d) ||
    d.schema !== KERNELS_SCHEMA ||
    !Array.isArray(d.kernels) ||
    !Array.isArray(d.others)
  ) {
    throw new Error('not an answer of the jupyter_gpumem server extension');
  }
  return {
    ...d,
    orphans: Array.isArray(d.orphans) ? d.orphans : []
  };
}

/** Builders of the requests, so their shape lives in one place. */
export namespace Requests {
  export function refresh(id: RequestId): IRefreshRequest {
    return { type: 'refresh', id };
  }

  export function purge(
    id: RequestId,
    names: string[],
    dryRun = false
  ): IPurgeRequest {
    return { type: 'purge', id, names: [...names], dry_run: dryRun };
  }

  export function setDevice(id: RequestId, device: string): ISetDeviceRequest {
    return { type: 'set_device', id, device };
  }

  export function hello(id: RequestId): IHelloRequest {
    return { type: 'hello', id };
  }

  export function cancel(id: RequestId, request: RequestId): ICancelRequest {
    return { type: 'cancel', id, request };
  }
}
