/**
 * One kernel as the sidebar knows it: its link state, readings, selection,
 * requests waiting, and how its readings accumulate (the timeline per device,
 * the cells run, when a purge result expires). No DOM, no kernel, no signal:
 * the model (model.ts) picks the kernel and says when it changed.
 */
import { TIMELINE_POINTS } from './constants';
import {
  IDeviceUsage,
  IPurgeResult,
  ISnapshot,
  RequestId,
  SidebarRequest
} from './protocol';

/**
 * Where the link to the kernel stands.
 *
 * - `no-kernel`: no notebook in focus, or it has no kernel.
 * - `connecting`: a comm was opened; no `hello` yet (the kernel may be busy).
 * - `restarting`: the kernel restarts; a comm opens once it is back.
 * - `not-loaded`: the kernel closed the comm: it has not loaded the extension.
 * - `loading`: the sidebar is running `%load_ext jupyter_gpumem`.
 * - `ready`: `hello` received; messages flow.
 * - `dead`: the kernel died.
 */
export type ConnectionState =
  | 'no-kernel'
  | 'connecting'
  | 'restarting'
  | 'not-loaded'
  | 'loading'
  | 'ready'
  | 'dead';

/** One reading of one device, for the timeline. */
export interface ITimelinePoint {
  time: number;
  allocated: number | null;
  reserved: number | null;
  used: number | null;
  /** Bytes of the tensors the scan found on it (host memory), when known. */
  tracked?: number | null;
}

/** One cell's run, in seconds since the epoch (`end` null while it runs). */
export interface ICellBand {
  start: number;
  end: number | null;
}

/** A request sent to the kernel that has no final answer yet. */
export interface IPendingRequest {
  id: RequestId;
  request: SidebarRequest;
  /** When it was sent, ms since the epoch. */
  sent: number;
  /** The kernel said it runs when the running cell ends. */
  queued: boolean;
  /** The kernel's line about the queue (`queued: runs when the cell ends`). */
  message: string | null;
}

/** The server's reading of a kernel whose comm is not open yet. */
export interface IServerReading {
  time: number;
  /** Resident memory of the kernel and its children, bytes. */
  rss: number | null;
  /** Bytes per GPU, when the server has NVML. */
  gpu: { [device: string]: number };
  /** The server's line when it has no GPU figures. */
  message: string | null;
}

/** Least age of a purge result before a memory change clears it, in seconds. */
const PURGE_RESULT_MIN_S = 3;

/** Change of a device's allocated bytes that clears a purge result. */
const PURGE_RESULT_CHANGE = 1 << 20;

/** Everything the sidebar knows about one kernel. */
export class KernelView {
  /**
   * A kernel in `state`; `seen` collects the device ids of every kernel (the
   * model's, shared by all its views).
   */
  constructor(state: ConnectionState, label: string, seen: Set<string>) {
    this.state = state;
    this.kernelLabel = label;
    this.seen = seen;
  }

  readonly seen: Set<string>;
  state: ConnectionState;
  kernelLabel: string;
  version: string | null = null;
  /** The kernel side says it takes the newer requests (its `hello` has `busy`). */
  modern = false;
  devices: IDeviceUsage[] = [];
  devicesReceived = false;
  snapshot: ISnapshot | null = null;
  timeline = new Map<string, ITimelinePoint[]>();
  cells: ICellBand[] = [];
  selected: ReadonlySet<string> = new Set<string>();
  lastPurge: IPurgeResult | null = null;
  /** Time of the first device reading after the last purge result. */
  purgeReadingsAt: number | null = null;
  /** Allocated bytes per device in that reading. */
  purgeReadings = new Map<string, number>();
  snapshotsSincePurge = 0;
  error: string | null = null;
  cellRunning = false;
  pending = new Map<RequestId, IPendingRequest>();
  noAnswer: IPendingRequest | null = null;
  serverReading: IServerReading | null = null;

  /** The answer to `id` came (null: some answer came: the kernel is alive). */
  answered(id: RequestId | null): void {
    if (id !== null) {
      this.pending.delete(id);
    }
    this.noAnswer = null;
  }

  /**
   * A purge result stays until memory changed: a device reading at least
   * `PURGE_RESULT_MIN_S` after the first one that followed it, whose
   * allocated bytes differ by `PURGE_RESULT_CHANGE` or more on some device
   * (or, for an older kernel, the second snapshot after it).
   */
  expirePurge(devices: IDeviceUsage[], time: number): void {
    if (!this.lastPurge || this.lastPurge.dry_run) {
      return;
    }
    const now = new Map(
      devices
        .filter(d => typeof d.allocated === 'number')
        .map(d => [d.id, d.allocated as number])
    );
    if (this.purgeReadingsAt === null) {
      this.purgeReadingsAt = time;
      this.purgeReadings = now;
      return;
    }
    if (time - this.purgeReadingsAt < PURGE_RESULT_MIN_S) {
      return;
    }
    for (const [id, bytes] of now) {
      const before = this.purgeReadings.get(id);
      if (
        before !== undefined &&
        Math.abs(bytes - before) >= PURGE_RESULT_CHANGE
      ) {
        this.lastPurge = null;
        return;
      }
    }
  }

  /** A cell known from the kernel's snapshot (start and end), if not yet seen. */
  addCell(start: number, end: number): void {
    if (this.cells.some(c => Math.abs(c.start - start) < 0.05)) {
      return;
    }
    this.cells = [...this.cells, { start, end }]
      .sort((a, b) => a.start - b.start)
      .slice(-TIMELINE_POINTS);
  }

  /** Add one point in time order (a point at a time already there is dropped). */
  addPoint(id: string, point: ITimelinePoint): void {
    this.seen.add(id);
    const points = [...(this.timeline.get(id) ?? [])];
    const last = points[points.length - 1];
    if (!last || last.time < point.time) {
      points.push(point);
    } else if (!points.some(p => p.time === point.time)) {
      points.push(point);
      points.sort((a, b) => a.time - b.time);
    } else {
      return;
    }
    this.timeline.set(id, points.slice(-TIMELINE_POINTS));
  }

  /**
   * The latest device readings (from `devices`, or a snapshot's): one point
   * per device into the timeline.
   */
  setDevices(
    devices: IDeviceUsage[],
    time: number,
    snapshot?: ISnapshot
  ): void {
    if (!snapshot && this.snapshot) {
      // a `devices` reading has no scan behind it: the tensors found on a
      // host device are the last snapshot's
      const scanned = new Map(this.snapshot.devices.map(d => [d.id, d]));
      devices = devices.map(d =>
        d.kind === 'cpu' && scanned.has(d.id)
          ? { ...d, attributed: scanned.get(d.id)!.attributed }
          : d
      );
    }
    this.devices = devices;
    this.devicesReceived = true;
    for (const device of devices) {
      this.seen.add(device.id);
      const points = this.timeline.get(device.id) ?? [];
      const last = points[points.length - 1];
      if (last && last.time >= time) {
        continue;
      }
      this.addPoint(device.id, {
        time,
        allocated: device.allocated ?? null,
        reserved: device.reserved ?? null,
        used: device.used_process ?? null,
        tracked: tracked(device, snapshot) ?? last?.tracked ?? null
      });
    }
  }

  /** The purge arguments of the last snapshot's holders. */
  purgeable(): Set<string> {
    return new Set(
      (this.snapshot?.holders ?? [])
        .map(h => h.purge)
        .filter((p): p is string => !!p)
    );
  }

  /** Uncheck the names the last snapshot no longer lists. */
  pruneSelection(): void {
    const purgeable = this.purgeable();
    this.selected = new Set(
      [...this.selected].filter(name => purgeable.has(name))
    );
  }
}

/**
 * Bytes of the tensors found on a host device: its `attributed` figure, or the
 * snapshot's holders on it (a `devices` reading carries no scan).
 */
function tracked(device: IDeviceUsage, snapshot?: ISnapshot): number | null {
  if (device.kind !== 'cpu') {
    return null;
  }
  if (!snapshot) {
    return null; // a `devices` reading: no scan behind its figures
  }
  if (typeof device.attributed === 'number') {
    return device.attributed;
  }
  return snapshot.holders.reduce(
    (acc, h) => acc + (h.devices[device.id] ?? 0),
    0
  );
}
