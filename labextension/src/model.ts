/**
 * What the sidebar knows about the kernel in focus, and how kernel messages
 * change it. No DOM and no kernel here: the view renders it, the channel
 * feeds it.
 */
import { ISignal, Signal } from '@lumino/signaling';

import { DEFAULT_DEVICE, TIMELINE_POINTS } from './constants';
import {
  IDeviceUsage,
  IPurgeResult,
  ISnapshot,
  KernelMessage
} from './protocol';

/**
 * Where the link to the kernel stands.
 *
 * - `no-kernel`: no notebook in focus, or it has no kernel.
 * - `connecting`: a comm was opened; no `hello` yet (the kernel may be busy).
 * - `not-loaded`: the kernel closed the comm: it has not loaded the extension.
 * - `loading`: the sidebar is running `%load_ext jupyter_gpumem`.
 * - `ready`: `hello` received; messages flow.
 * - `dead`: the kernel died.
 */
export type ConnectionState =
  'no-kernel' | 'connecting' | 'not-loaded' | 'loading' | 'ready' | 'dead';

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

/**
 * The sidebar's state.
 */
export class SidebarModel {
  /** Emitted after any change. */
  get changed(): ISignal<this, void> {
    return this._changed;
  }

  /** Link state. */
  get state(): ConnectionState {
    return this._state;
  }

  /** Display name of the notebook (or console) in focus. */
  get kernelLabel(): string {
    return this._kernelLabel;
  }

  /** The device selection sent to the kernel. */
  get device(): string {
    return this._device;
  }

  /** Version of the kernel side, from `hello`. */
  get version(): string | null {
    return this._version;
  }

  /** Latest device readings (from `devices` or a snapshot). */
  get devices(): ReadonlyArray<IDeviceUsage> {
    return this._devices;
  }

  /** Latest snapshot, or null before the first. */
  get snapshot(): ISnapshot | null {
    return this._snapshot;
  }

  /**
   * Readings per device id, oldest first. Kept per device across device
   * selections (the same device reads the same under `auto` and `all`).
   */
  get timeline(): ReadonlyMap<string, ReadonlyArray<ITimelinePoint>> {
    return this._timeline;
  }

  /** The cells run in this kernel while the sidebar followed it, oldest first. */
  get cells(): ReadonlyArray<ICellBand> {
    return this._cells;
  }

  /** Record that a cell started (`execute_input` seen), at `time` (epoch seconds). */
  cellStarted(time: number): void {
    const last = this._cells[this._cells.length - 1];
    if (last && last.end === null) {
      last.end = time;
    }
    this._cells = [...this._cells, { start: time, end: null }].slice(
      -TIMELINE_POINTS
    );
    this._changed.emit();
  }

  /** Record that the running cell ended (the kernel went idle). */
  cellEnded(time: number): void {
    const last = this._cells[this._cells.length - 1];
    if (last && last.end === null) {
      this._cells = [
        ...this._cells.slice(0, -1),
        { start: last.start, end: time }
      ];
      this._changed.emit();
    }
  }

  /** Purge arguments of the checked holders. */
  get selected(): ReadonlySet<string> {
    return this._selected;
  }

  /** Result of the last purge, or null. */
  get lastPurge(): IPurgeResult | null {
    return this._lastPurge;
  }

  /** Last error line (from the kernel or the link), or null. */
  get error(): string | null {
    return this._error;
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
    if (this._snapshot) {
      return !this._snapshot.accelerator;
    }
    return this._devicesReceived && !this._devices.some(d => d.kind !== 'cpu');
  }

  /**
   * Follow another kernel: forget everything about the previous one, keep
   * the device selection.
   */
  reset(state: ConnectionState, kernelLabel: string): void {
    this._state = state;
    this._kernelLabel = kernelLabel;
    this._version = null;
    this._devices = [];
    this._devicesReceived = false;
    this._snapshot = null;
    this._timeline = new Map();
    this._cells = [];
    this._selected = new Set();
    this._lastPurge = null;
    this._snapshotsSincePurge = 0;
    this._error = null;
    this._changed.emit();
  }

  /** Change the link state. */
  setState(state: ConnectionState, error: string | null = null): void {
    this._state = state;
    if (error !== null) {
      this._error = error;
    }
    this._changed.emit();
  }

  /** Choose the device selection; the caller asks the kernel for it. */
  setDevice(device: string): void {
    if (device === this._device) {
      return;
    }
    this._device = device;
    this._snapshot = null;
    this._devices = [];
    this._devicesReceived = false;
    this._selected = new Set();
    this._changed.emit();
  }

  /** Forget the last purge result (the user dismissed it). */
  dismissPurge(): void {
    if (this._lastPurge) {
      this._lastPurge = null;
      this._changed.emit();
    }
  }

  /** Record an error line to show. */
  setError(message: string | null): void {
    this._error = message;
    this._changed.emit();
  }

  /** Check or uncheck a holder, by its purge argument. */
  toggle(purgeName: string, checked: boolean): void {
    const purgeable = new Set(
      (this._snapshot?.holders ?? []).map(h => h.purge).filter(p => p)
    );
    if (checked && !purgeable.has(purgeName)) {
      return;
    }
    const next = new Set(this._selected);
    if (checked) {
      next.add(purgeName);
    } else {
      next.delete(purgeName);
    }
    this._selected = next;
    this._changed.emit();
  }

  /** Apply one message from the kernel. */
  handle(message: KernelMessage): void {
    switch (message.type) {
      case 'hello':
        this._state = 'ready';
        this._version = message.version ?? null;
        this._error = null;
        break;
      case 'devices':
        if (this._state === 'connecting') {
          this._state = 'ready';
        }
        this._setDevices(message.devices, message.time);
        break;
      case 'snapshot': {
        this._state = 'ready';
        this._snapshot = message.snapshot;
        this._setDevices(
          message.snapshot.devices,
          message.snapshot.time,
          message.snapshot
        );
        this._pruneSelection();
        const cell = message.snapshot.cell;
        if (
          cell &&
          typeof cell.start === 'number' &&
          typeof cell.end === 'number'
        ) {
          this._addCell(cell.start, cell.end);
        }
        // the snapshot that follows a purge shows its effect; the next one
        // (a cell, a refresh) is newer than the purge: its result goes
        if (this._lastPurge) {
          this._snapshotsSincePurge += 1;
          if (this._snapshotsSincePurge > (this._lastPurge.dry_run ? 0 : 1)) {
            this._lastPurge = null;
          }
        }
        break;
      }
      case 'purge_result':
        this._lastPurge = message.result;
        this._snapshotsSincePurge = 0;
        this._error = null;
        if (!message.result.dry_run) {
          this._selected = new Set();
        }
        break;
      case 'error':
        this._error = message.message;
        break;
    }
    this._changed.emit();
  }

  /** A cell known from the kernel's snapshot (start and end), if not yet seen. */
  private _addCell(start: number, end: number): void {
    if (this._cells.some(c => Math.abs(c.start - start) < 0.05)) {
      return;
    }
    this._cells = [...this._cells, { start, end }]
      .sort((a, b) => a.start - b.start)
      .slice(-TIMELINE_POINTS);
  }

  private _setDevices(
    devices: IDeviceUsage[],
    time: number,
    snapshot?: ISnapshot
  ): void {
    if (!snapshot && this._snapshot) {
      // a `devices` reading has no scan behind it: the tensors found on a
      // host device are the last snapshot's
      const scanned = new Map(this._snapshot.devices.map(d => [d.id, d]));
      devices = devices.map(d =>
        d.kind === 'cpu' && scanned.has(d.id)
          ? { ...d, attributed: scanned.get(d.id)!.attributed }
          : d
      );
    }
    this._devices = devices;
    this._devicesReceived = true;
    for (const device of devices) {
      this._seen.add(device.id);
      const points = [...(this._timeline.get(device.id) ?? [])];
      const last = points[points.length - 1];
      if (last && last.time >= time) {
        continue;
      }
      points.push({
        time,
        allocated: device.allocated ?? null,
        reserved: device.reserved ?? null,
        used: device.used_process ?? null,
        tracked: tracked(device, snapshot) ?? last?.tracked ?? null
      });
      this._timeline.set(device.id, points.slice(-TIMELINE_POINTS));
    }
  }

  private _pruneSelection(): void {
    const purgeable = new Set(
      (this._snapshot?.holders ?? []).map(h => h.purge).filter(p => p)
    );
    this._selected = new Set(
      [...this._selected].filter(name => purgeable.has(name))
    );
  }

  private _changed = new Signal<this, void>(this);
  private _state: ConnectionState = 'no-kernel';
  private _kernelLabel = '';
  private _device: string = DEFAULT_DEVICE;
  private _version: string | null = null;
  private _devices: IDeviceUsage[] = [];
  private _devicesReceived = false;
  private _snapshot: ISnapshot | null = null;
  private _timeline = new Map<string, ITimelinePoint[]>();
  private _cells: ICellBand[] = [];
  private _snapshotsSincePurge = 0;
  private _selected = new Set<string>();
  private _lastPurge: IPurgeResult | null = null;
  private _error: string | null = null;
  private _seen = new Set<string>();
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
