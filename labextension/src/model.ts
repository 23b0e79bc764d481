/**
 * What the sidebar knows about each kernel it has followed, and how kernel
 * messages change it. No DOM and no kernel here: the view renders the kernel
 * shown, the channel feeds every kernel it keeps a link to.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { DEFAULT_DEVICE, TIMELINE_POINTS } from './constants';
import {
  ConnectionState,
  ICellBand,
  IPendingRequest,
  IServerReading,
  ITimelinePoint,
  KernelView
} from './kernelView';
import {
  IDeviceUsage,
  IHelloMessage,
  IPurgeResult,
  ISnapshot,
  KernelMessage,
  RequestId,
  SidebarRequest
} from './protocol';

/**
 * The sidebar's state: one view per kernel followed; the getters read the
 * kernel shown.
 */
export class SidebarModel {
  /** Emitted after any change of the kernel shown. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Link state. */
  get state(): ConnectionState {
    return this._v.state;
  }

  /** Display name of the notebook (or console) in focus. */
  get kernelLabel(): string {
    return this._v.kernelLabel;
  }

  /** The device selection sent to the kernel. */
  get device(): string {
    return this._device;
  }

  /** Version of the kernel side, from `hello`. */
  get version(): string | null {
    return this._v.version;
  }

  /** Whether the kernel side takes the newer requests (its `hello` has `busy`). */
  get modern(): boolean {
    return this._v.modern;
  }

  /** Latest device readings (from `devices` or a snapshot). */
  get devices(): ReadonlyArray<IDeviceUsage> {
    return this._v.devices;
  }

  /** Latest snapshot, or null before the first. */
  get snapshot(): ISnapshot | null {
    return this._v.snapshot;
  }

  /**
   * Readings per device id, oldest first. Kept per device across device
   * selections (the same device reads the same under `auto` and `all`), and
   * per kernel for the whole session.
   */
  get timeline(): ReadonlyMap<string, ReadonlyArray<ITimelinePoint>> {
    return this._v.timeline;
  }

  /** The cells run in this kernel while the sidebar followed it, oldest first. */
  get cells(): ReadonlyArray<ICellBand> {
    return this._v.cells;
  }

  /**
   * Whether a cell runs now: the tensors and holders shown are from before
   * it (the kernel scans between cells).
   */
  get cellRunning(): boolean {
    return this._v.cellRunning;
  }

  /** Requests sent with no final answer yet, oldest first. */
  get pending(): ReadonlyArray<IPendingRequest> {
    return [...this._v.pending.values()];
  }

  /** The request that got no answer in time (shown with Retry), or null. */
  get noAnswer(): IPendingRequest | null {
    return this._v.noAnswer;
  }

  /** The server's reading while the comm is not open yet, or null. */
  get serverReading(): IServerReading | null {
    return this._v.serverReading;
  }

  /** Record that a cell started (`execute_input` seen), at `time` (epoch seconds). */
  cellStarted(time: number): void {
    const v = this._v;
    const last = v.cells[v.cells.length - 1];
    if (last && last.end === null) {
      last.end = time;
    }
    v.cells = [...v.cells, { start: time, end: null }].slice(-TIMELINE_POINTS);
    v.cellRunning = true;
    this._emit();
  }

  /** Record that the running cell ended (the kernel went idle). */
  cellEnded(time: number): void {
    const v = this._v;
    const last = v.cells[v.cells.length - 1];
    const wasRunning = v.cellRunning;
    v.cellRunning = false;
    if (last && last.end === null) {
      v.cells = [...v.cells.slice(0, -1), { start: last.start, end: time }];
      this._emit();
    } else if (wasRunning) {
      this._emit();
    }
  }

  /** Purge arguments of the checked holders. */
  get selected(): ReadonlySet<string> {
    return this._v.selected;
  }

  /** Result of the last purge, or null. */
  get lastPurge(): IPurgeResult | null {
    return this._v.lastPurge;
  }

  /** Last error line (from the kernel or the link), or null. */
  get error(): string | null {
    return this._v.error;
  }

  /** Device ids seen so far (for the device menu). */
  get seenDevices(): ReadonlyArray<string> {
    return [...this._seen];
  }

  /**
   * Whether the kernel reports no accelerator: its snapshot says so, or the
   * device readings for `auto` hold no accelerator.
   */
  get noAccelerator(): boolean {
    const v = this._v;
    if (v.snapshot) {
      return !v.snapshot.accelerator;
    }
    return v.devicesReceived && !v.devices.some(d => d.kind !== 'cpu');
  }

  /**
   * Show the kernel `key` (null: none). A kernel seen before comes back with
   * all it had (its timeline too); a new one starts in `state`.
   */
  show(key: string | null, kernelLabel: string, state: ConnectionState): void {
    let v = key === null ? undefined : this._views.get(key);
    if (!v) {
      v = new KernelView(state, kernelLabel, this._seen);
      if (key !== null) {
        this._views.set(key, v);
      }
    }
    v.kernelLabel = kernelLabel;
    this._v = this._shown = v;
    this._changed.emit();
  }

  /** Forget the kernel `key` (its notebook was closed). */
  forget(key: string): void {
    const v = this._views.get(key);
    this._views.delete(key);
    if (v && v === this._shown) {
      this.show(null, '', 'no-kernel');
    }
  }

  /** The keys of the kernels known. */
  get keys(): ReadonlyArray<string> {
    return [...this._views.keys()];
  }

  /**
   * Run `fn` on the kernel `key` (the model's methods then work on it, shown
   * or not); nothing when the key is unknown.
   */
  inKernel<T>(key: string, fn: () => T): T | undefined {
    const v = this._views.get(key);
    if (!v) {
      return undefined;
    }
    const saved = this._v;
    this._v = v;
    try {
      return fn();
    } finally {
      this._v = saved;
    }
  }

  /** Whether `key` is the kernel shown. */
  isShown(key: string): boolean {
    return this._views.get(key) === this._shown;
  }

  /**
   * The kernel restarted or changed: forget what it had, keep the device
   * selection. The timeline stays (the notebook's history of the session).
   */
  reset(state: ConnectionState, kernelLabel: string): void {
    const v = this._v;
    const timeline = v.timeline;
    const cells = v.cells;
    // in place: the channel's `inKernel` holds this very view
    Object.assign(v, new KernelView(state, kernelLabel, this._seen));
    v.timeline = timeline;
    v.cells = cells;
    this._emit();
  }

  /** Change the link state. */
  setState(state: ConnectionState, error: string | null = null): void {
    this._v.state = state;
    if (error !== null) {
      this._v.error = error;
    }
    this._emit();
  }

  /** Choose the device selection; the caller asks the kernel for it. */
  setDevice(device: string): void {
    if (device === this._device) {
      return;
    }
    this._device = device;
    const v = this._v;
    v.snapshot = null;
    v.devices = [];
    v.devicesReceived = false;
    v.selected = new Set();
    this._emit();
  }

  /** Forget the last purge result (the user dismissed it). */
  dismissPurge(): void {
    if (this._v.lastPurge) {
      this._v.lastPurge = null;
      this._emit();
    }
  }

  /** Record an error line to show. */
  setError(message: string | null): void {
    this._v.error = message;
    this._emit();
  }

  /**
   * The server's reading of a kernel whose comm is not open (null: none); it
   * goes into the timeline too (host: `cpu`, GPUs by their id).
   */
  setServerReading(reading: IServerReading | null): void {
    this._v.serverReading = reading;
    if (reading) {
      const figures: [string, number | null][] = [
        ['cpu', reading.rss],
        ...Object.entries(reading.gpu)
      ];
      for (const [id, bytes] of figures) {
        if (typeof bytes === 'number') {
          this._v.addPoint(id, {
            time: reading.time,
            allocated: null,
            reserved: null,
            used: bytes,
            tracked: null
          });
        }
      }
    }
    this._emit();
  }

  /** Check or uncheck a holder, by its purge argument. */
  toggle(purgeName: string, checked: boolean): void {
    this.toggleMany([purgeName], checked);
  }

  /** Check or uncheck several holders at once (one change). */
  toggleMany(purgeNames: ReadonlyArray<string>, checked: boolean): void {
    const v = this._v;
    const purgeable = v.purgeable();
    const next = new Set(v.selected);
    for (const name of purgeNames) {
      if (checked && purgeable.has(name)) {
        next.add(name);
      } else if (!checked) {
        next.delete(name);
      }
    }
    v.selected = next;
    this._emit();
  }

  /** A request went to the kernel: it waits for its answer. */
  requestSent(request: SidebarRequest, now = Date.now()): void {
    this._v.pending.set(request.id, {
      id: request.id,
      request,
      sent: now,
      queued: false,
      message: null
    });
    this._emit();
  }

  /**
   * A request got no answer in time: shown with Retry (a queued one waits
   * for its cell, it is never late). False when it was answered already.
   */
  requestTimedOut(id: RequestId): boolean {
    const v = this._v;
    const pending = v.pending.get(id);
    if (!pending || pending.queued) {
      return false;
    }
    v.pending.delete(id);
    v.noAnswer = pending;
    this._emit();
    return true;
  }

  /** Forget the "no answer" line (the user retried, or another answer came). */
  clearNoAnswer(): void {
    if (this._v.noAnswer) {
      this._v.noAnswer = null;
      this._emit();
    }
  }

  /** The answer to `id` came (a part of a split purge: no message to show). */
  answered(id: RequestId): void {
    this._v.answered(id);
    this._emit();
  }

  /** Forget every request waiting (the link closed). */
  dropPending(): void {
    this._v.pending.clear();
    this._emit();
  }

  /** Apply one message from the kernel. */
  handle(message: KernelMessage): void {
    const v = this._v;
    const replyTo =
      'reply_to' in message && message.reply_to !== undefined
        ? message.reply_to
        : null;
    if (message.type === 'queued') {
      const pending = v.pending.get(message.reply_to);
      if (pending) {
        pending.queued = true;
        pending.message = message.message || 'queued: runs when the cell ends';
      }
      v.answered(null);
      this._emit();
      return;
    }
    if (message.type === 'cancelled') {
      v.pending.delete(message.request);
      v.pending.delete(message.reply_to);
      v.answered(null);
      this._emit();
      return;
    }
    if (replyTo !== null) {
      v.answered(replyTo);
    }
    switch (message.type) {
      case 'hello':
        this._hello(message);
        break;
      case 'devices':
        if (v.state === 'connecting' || v.state === 'restarting') {
          v.state = 'ready';
        }
        if (typeof message.cell_running === 'boolean') {
          v.cellRunning = message.cell_running;
        }
        v.serverReading = null;
        v.setDevices(message.devices, message.time);
        v.expirePurge(message.devices, message.time);
        break;
      case 'snapshot': {
        v.state = 'ready';
        v.serverReading = null;
        v.snapshot = message.snapshot;
        if (typeof message.snapshot.cell_running === 'boolean') {
          v.cellRunning = message.snapshot.cell_running;
        }
        v.setDevices(
          message.snapshot.devices,
          message.snapshot.time,
          message.snapshot
        );
        v.pruneSelection();
        const cell = message.snapshot.cell;
        if (
          cell &&
          typeof cell.start === 'number' &&
          typeof cell.end === 'number'
        ) {
          v.addCell(cell.start, cell.end);
        }
        // the snapshot that follows a purge shows its effect; the next one
        // (a cell, a refresh) is newer than the purge: its result goes
        if (v.lastPurge) {
          v.snapshotsSincePurge += 1;
          if (v.snapshotsSincePurge > (v.lastPurge.dry_run ? 0 : 1)) {
            v.lastPurge = null;
          }
        }
        break;
      }
      case 'purge_result':
        v.lastPurge = message.result;
        v.purgeReadingsAt = null;
        v.snapshotsSincePurge = 0;
        v.error = null;
        if (!message.result.dry_run) {
          v.selected = new Set();
        }
        break;
      case 'error':
        v.error = message.message;
        break;
    }
    this._emit();
  }

  private _hello(message: IHelloMessage): void {
    const v = this._v;
    v.state = 'ready';
    v.version = message.version ?? null;
    v.error = null;
    v.serverReading = null;
    if (typeof message.busy === 'boolean') {
      v.modern = true;
      v.cellRunning = message.busy;
    }
    for (const reading of message.timeline ?? []) {
      if (
        !reading ||
        typeof reading.time !== 'number' ||
        typeof reading.devices !== 'object'
      ) {
        continue;
      }
      for (const [id, d] of Object.entries(reading.devices ?? {})) {
        v.addPoint(id, {
          time: reading.time,
          allocated: d?.allocated ?? null,
          reserved: d?.reserved ?? null,
          used: d?.used_process ?? null,
          tracked: null
        });
      }
    }
  }

  /** Emit `changed` when the kernel worked on is the one shown. */
  private _emit(): void {
    if (this._v === this._shown) {
      this._changed.emit();
    }
  }

  private _changed = new Signal<this, void>(this);
  private _device: string = DEFAULT_DEVICE;
  private _seen = new Set<string>();
  /** The kernel a method works on (the shown one, or the one `inKernel` names). */
  private _v: KernelView = new KernelView('no-kernel', '', this._seen);
  /** The kernel shown. */
  private _shown: KernelView = this._v;
  private _views = new Map<string, KernelView>();
}
