/**
 * The "GPU Memory" sidebar widget: header with the device choice, link
 * status, device bars, timeline, holders table and the purge button.
 */
import type { Message } from '@lumino/messaging';
import { Poll } from '@lumino/polling';
import { Widget } from '@lumino/widgets';

import { KernelChannel } from './channel';
import { DEVICE_CHOICES, REFRESH_INTERVAL_MS } from './constants';
import { h } from './dom';
import { clockTime, formatBytes } from './format';
import { HoldersTable } from './holders';
import { IServerReading } from './kernelView';
import { SidebarModel } from './model';
import { IDeviceUsage } from './protocol';
import { TimelineView } from './timeline';
import { renderClusterDevices, renderClusterHolders } from './viewCluster';
import { renderDevices } from './viewDevices';
import { predictedBytes, renderHolderNotes } from './viewHolderNotes';
import { renderPurgeResult } from './viewPurge';

/** Snapshot messages that say what the no-accelerator line says already. */
const NO_ACCELERATOR_MESSAGE = /^no accelerator\b/i;

/**
 * What the sidebar shows, as its title: `GPU memory`, `Host memory` or
 * `GPU and host memory`, from the kinds of the devices shown; `Kernel memory`
 * before any reading (no word of a GPU there may not be).
 */
export function titleFor(devices: ReadonlyArray<IDeviceUsage>): string {
  const host = devices.some(d => d.kind === 'cpu');
  const accelerator = devices.some(d => d.kind !== 'cpu');
  if (host && accelerator) {
    return 'GPU and host memory';
  }
  if (host) {
    return 'Host memory';
  }
  if (accelerator) {
    return 'GPU memory';
  }
  return 'Kernel memory';
}

/**
 * The devices a server reading stands for (a kernel whose comm is not open):
 * its resident memory as host memory, its bytes on each GPU.
 */
export function serverDevices(reading: IServerReading): IDeviceUsage[] {
  const base = {
    name: null,
    total: null,
    used_all: null,
    other_processes: null,
    free: null,
    frameworks: [],
    allocated: null,
    reserved: null,
    non_framework: null,
    fragmentation: null,
    attributed: null,
    notes: []
  };
  const out: IDeviceUsage[] = [];
  if (reading.rss !== null) {
    out.push({ ...base, id: 'cpu', kind: 'cpu', used_process: reading.rss });
  }
  for (const [id, bytes] of Object.entries(reading.gpu)) {
    out.push({
      ...base,
      id,
      kind: 'cuda',
      used_process: bytes,
      allocated: bytes
    });
  }
  return out;
}

/** Asks the user to confirm a purge; resolves true to go ahead. */
export type ConfirmPurge = (
  names: string[],
  predictedBytes: number,
  notebook: string
) => Promise<boolean>;

/**
 * The sidebar. It renders the model on every change and turns clicks into
 * channel requests; a purge goes through `confirmPurge` first.
 */
export class GpuMemSidebar extends Widget {
  constructor(options: GpuMemSidebar.IOptions) {
    super();
    this.addClass('jp-GpuMem');
    this.model = options.model;
    this.channel = options.channel;
    this._confirmPurge = options.confirmPurge;
    this._build();
    this.model.changed.connect(this._render, this);
    this._poll = new Poll({
      factory: async () => {
        if (this.isVisible) {
          this.channel.refreshIfIdle();
        }
      },
      frequency: {
        interval: options.refreshInterval ?? REFRESH_INTERVAL_MS,
        backoff: false
      },
      standby: 'when-hidden',
      name: 'jupyter-gpumem:refresh'
    });
    this._render();
  }

  readonly model: SidebarModel;
  readonly channel: KernelChannel;

  /** The refresh poll (holders while the kernel is idle). */
  get poll(): Poll {
    return this._poll;
  }

  /** The timeline charts. */
  get timeline(): TimelineView {
    return this._timeline;
  }

  /** Refresh interval of the holders while the kernel is idle, in ms (a setting). */
  get refreshInterval(): number {
    return this._poll.frequency.interval;
  }

  set refreshInterval(ms: number) {
    if (
      !Number.isFinite(ms) ||
      ms <= 0 ||
      ms === this._poll.frequency.interval
    ) {
      return;
    }
    this._poll.frequency = { ...this._poll.frequency, interval: ms };
  }

  dispose(): void {
    if (this.isDisposed) {
      return;
    }
    this._timeline.dispose();
    this._poll.dispose();
    this.model.changed.disconnect(this._render, this);
    super.dispose();
  }

  /** Purge the checked holders, after confirmation. */
  async purgeSelected(): Promise<boolean> {
    const names = [...this.model.selected];
    if (names.length === 0 || this._purging) {
      return false;
    }
    const bytes = predictedBytes(
      this.model.snapshot?.holders ?? [],
      this.model.selected
    );
    this._purging = true;
    try {
      if (!(await this._confirmPurge(names, bytes, this.model.kernelLabel))) {
        return false;
      }
      return this.channel.purge(names);
    } finally {
      this._purging = false;
    }
  }

  private _build(): void {
    this._deviceSelect.setAttribute('aria-label', 'Device');
    this._deviceSelect.addEventListener('change', () => {
      this.channel.setDevice(this._deviceSelect.value);
    });
    const refresh = h(
      'button',
      {
        class: 'jp-GpuMem-button jp-GpuMem-refresh',
        title: 'Scan the kernel again: which names hold memory'
      },
      'Scan again'
    );
    refresh.addEventListener('click', () => this.channel.refresh());
    this._purgeButton.addEventListener(
      'click',
      () => void this.purgeSelected()
    );
    this.node.append(
      h('div', { class: 'jp-GpuMem-header' }, this._title, this._kernelLine),
      h(
        'div',
        { class: 'jp-GpuMem-toolbar' },
        h(
          'label',
          { class: 'jp-GpuMem-deviceLabel' },
          'Device ',
          this._deviceSelect
        ),
        refresh
      ),
      this._status,
      this._devicesBox,
      this._timelineBox,
      this._stale,
      this._holdersBox,
      this._resultBox,
      h('div', { class: 'jp-GpuMem-actions' }, this._purgeButton)
    );
    this._holdersBox.append(this._table.node, this._notesBox);
    this._timelineBox.append(this._timeline.node);
  }

  protected onResize(msg: Widget.ResizeMessage): void {
    super.onResize(msg);
    this._renderTimeline();
  }

  /** Width the charts are drawn at: the sidebar's content width. */
  private _chartWidth(): number {
    const width = this._timelineBox.clientWidth || this.node.clientWidth - 16;
    return Math.max(Math.floor(width), 0);
  }

  private _renderTimeline(): void {
    const model = this.model;
    const ready = model.state === 'ready';
    this._timeline.update(
      model.timeline,
      ready ? model.devices.map(d => d.id) : [],
      model.cells,
      this._chartWidth()
    );
  }

  protected onAfterShow(msg: Message): void {
    super.onAfterShow(msg);
    if (this._renderLater) {
      this._render();
    }
    this._table.redraw();
  }

  /** The holders table (filter, sort, select all). */
  get table(): HoldersTable {
    return this._table;
  }

  private _render(): void {
    if (!this.isVisible && this.isAttached) {
      // hidden (collapsed sidebar): render when shown again
      this._renderLater = true;
      return;
    }
    this._renderLater = false;
    const model = this.model;
    this._kernelLine.textContent = model.kernelLabel
      ? `${model.kernelLabel}${model.version ? ` · jupyter_gpumem ${model.version}` : ''}`
      : 'No notebook in focus';
    this._kernelLine.title = model.kernelLabel
      ? `Kernel of ${model.kernelLabel}${model.version ? ` (jupyter_gpumem ${model.version})` : ''}`
      : '';
    this._title.textContent = titleFor(model.devices);
    this._renderDeviceChoices();
    this._renderStatus();
    const ready = model.state === 'ready';
    const cluster = model.snapshot?.cluster ?? null;
    const waiting =
      model.state === 'connecting' || model.state === 'restarting';
    const reading = waiting ? model.serverReading : null;
    this._devicesBox.replaceChildren(
      ...(ready ? [renderDevices(model.devices)] : []),
      ...(ready && cluster ? [renderClusterDevices(cluster)] : []),
      ...(reading ? this._serverReading(reading) : [])
    );
    this._renderTimeline();
    const snapshot = model.snapshot;
    if (snapshot !== this._shownSnapshot) {
      this._shownSnapshot = snapshot;
      this._notesBox.replaceChildren(
        ...(snapshot
          ? renderHolderNotes(
              snapshot,
              message =>
                this._noAcceleratorShown() &&
                NO_ACCELERATOR_MESSAGE.test(message)
            )
          : [h('div', { class: 'jp-GpuMem-empty' }, 'No snapshot yet.')]),
        ...(cluster ? [renderClusterHolders(cluster)] : [])
      );
    }
    this._table.node.hidden = !snapshot || snapshot.holders.length === 0;
    if (snapshot) {
      this._table.update(snapshot, model.selected);
    } else {
      this._table.clear();
    }
    const stale = ready && model.cellRunning && snapshot !== null;
    this._stale.hidden = !stale;
    this._stale.textContent = stale
      ? `A cell is running: the tracked tensors and the holders are from before it (scanned at ${clockTime(
          snapshot!.time
        )}); the bars and the timeline are live.`
      : '';
    this._holdersBox.classList.toggle('jp-GpuMem-mod-stale', stale);
    this._holdersBox.hidden = !ready;
    const count = model.selected.size;
    this._purgeButton.textContent = count
      ? `Purge selected (${count}) · frees ${formatBytes(
          predictedBytes(model.snapshot?.holders ?? [], model.selected)
        )}`
      : 'Purge selected';
    this._purgeButton.disabled = !ready || count === 0;
    this._purgeButton.hidden = !ready;
    if (model.lastPurge !== this._shownPurge) {
      this._shownPurge = model.lastPurge;
      this._resultBox.replaceChildren(
        ...(model.lastPurge
          ? [renderPurgeResult(model.lastPurge, () => model.dismissPurge())]
          : [])
      );
    }
  }

  /**
   * Whether the status says "no GPU" in words (device `auto` or `all` with no
   * accelerator: the host is what is shown).
   */
  private _noAcceleratorShown(): boolean {
    const model = this.model;
    return (
      model.state === 'ready' && model.noAccelerator && model.device !== 'cpu'
    );
  }

  private _renderDeviceChoices(): void {
    const choices = [...DEVICE_CHOICES];
    for (const id of this.model.seenDevices) {
      if (!choices.includes(id)) {
        choices.push(id);
      }
    }
    if (!choices.includes(this.model.device)) {
      choices.push(this.model.device);
    }
    const key = choices.join('|');
    if (key !== this._choicesKey) {
      this._choicesKey = key;
      this._deviceSelect.replaceChildren(
        ...choices.map(choice => h('option', { value: choice }, choice))
      );
    }
    this._deviceSelect.value = this.model.device;
  }

  private _renderStatus(): void {
    const model = this.model;
    // rebuilt only when what it shows changes, so its buttons stay put
    // (a button replaced between mouse down and up loses the click)
    const busy = this.channel.kernel?.status === 'busy';
    const key = JSON.stringify([
      model.state,
      model.kernelLabel,
      model.error,
      model.noAccelerator,
      model.device,
      model.state === 'connecting' ? busy : null,
      model.noAnswer?.id ?? null,
      model.pending
        .filter(p => p.queued)
        .map(p => [p.id, p.request.type, p.message])
    ]);
    if (key === this._statusKey) {
      return;
    }
    this._statusKey = key;
    const parts: HTMLElement[] = [];
    const where = model.kernelLabel ? ` of ${model.kernelLabel}` : '';
    switch (model.state) {
      case 'no-kernel':
        parts.push(
          h(
            'div',
            { class: 'jp-GpuMem-notice' },
            'Open a notebook with a running kernel to see what holds its memory.'
          )
        );
        break;
      case 'connecting':
        parts.push(
          h(
            'div',
            { class: 'jp-GpuMem-notice' },
            busy
              ? `Connecting to the kernel${where}: it runs a cell, and answers once the cell ends (its figures from the server meanwhile)…`
              : `Connecting to the kernel${where}…`
          )
        );
        break;
      case 'restarting':
        parts.push(
          h(
            'div',
            { class: 'jp-GpuMem-notice' },
            `The kernel${where} restarts…`
          )
        );
        break;
      case 'loading':
        parts.push(
          h(
            'div',
            { class: 'jp-GpuMem-notice' },
            'Loading jupyter_gpumem in the kernel…'
          )
        );
        break;
      case 'dead':
        parts.push(
          h('div', { class: 'jp-GpuMem-notice' }, `The kernel${where} is dead.`)
        );
        break;
      case 'not-loaded': {
        const load = h(
          'button',
          { class: 'jp-GpuMem-button jp-mod-accept jp-GpuMem-load' },
          'Load jupyter_gpumem'
        );
        load.addEventListener('click', () => void this.channel.loadExtension());
        parts.push(
          h(
            'div',
            { class: 'jp-GpuMem-notice' },
            `The kernel${where} has not loaded jupyter_gpumem. `,
            'The button runs %load_ext jupyter_gpumem in it.'
          ),
          load
        );
        break;
      }
      case 'ready':
        if (
          model.noAccelerator &&
          (model.device === 'auto' || model.device === 'all')
        ) {
          parts.push(
            h(
              'div',
              { class: 'jp-GpuMem-notice jp-GpuMem-noAccelerator' },
              'No GPU in this kernel: showing host memory and the tensors on it.'
            )
          );
        } else if (model.noAccelerator && model.device !== 'cpu') {
          const useCpu = h(
            'button',
            { class: 'jp-GpuMem-button jp-GpuMem-useCpu' },
            'Show host memory'
          );
          useCpu.addEventListener('click', () => this.channel.setDevice('cpu'));
          parts.push(
            h(
              'div',
              { class: 'jp-GpuMem-notice jp-GpuMem-noAccelerator' },
              `This kernel has no ${model.device}.`
            ),
            useCpu
          );
        }
        break;
    }
    for (const pending of model.pending.filter(p => p.queued)) {
      const cancel = h(
        'button',
        {
          class: 'jp-GpuMem-button jp-GpuMem-cancel',
          'aria-label': `Cancel the queued ${pending.request.type}`
        },
        'Cancel'
      );
      cancel.addEventListener('click', () => this.channel.cancel(pending.id));
      parts.push(
        h(
          'div',
          {
            class: 'jp-GpuMem-notice jp-GpuMem-queued',
            role: 'status',
            'data-request': String(pending.id)
          },
          `${capitalize(describeRequest(pending.request.type))}: ${
            pending.message ?? 'queued: runs when the cell ends'
          } `,
          cancel
        )
      );
    }
    if (model.noAnswer) {
      const retry = h(
        'button',
        { class: 'jp-GpuMem-button jp-GpuMem-retry' },
        'Retry'
      );
      retry.addEventListener('click', () => this.channel.retry());
      parts.push(
        h(
          'div',
          { class: 'jp-GpuMem-error jp-GpuMem-noAnswer', role: 'alert' },
          `No answer from the kernel${where} to ${describeRequest(
            model.noAnswer.request.type,
            model.noAnswer.id
          )} after 10 s. `,
          retry
        )
      );
    }
    if (model.error) {
      parts.push(
        h('div', { class: 'jp-GpuMem-error', role: 'alert' }, model.error)
      );
    }
    this._status.replaceChildren(...parts);
  }

  /** The server's figures of a kernel whose comm is not open yet. */
  private _serverReading(reading: IServerReading): HTMLElement[] {
    const devices = serverDevices(reading);
    return [
      h(
        'div',
        { class: 'jp-GpuMem-chartTitle jp-GpuMem-serverReading' },
        `From the server at ${clockTime(reading.time)}: the kernel and its children`
      ),
      ...(devices.length ? [renderDevices(devices)] : []),
      ...(reading.message
        ? [h('div', { class: 'jp-GpuMem-note' }, reading.message)]
        : [])
    ];
  }

  private _confirmPurge: ConfirmPurge;
  private _poll: Poll;
  private _purging = false;
  private _choicesKey = '';
  private _statusKey = '';
  private _renderLater = false;
  private _shownSnapshot: unknown = undefined;
  private _shownPurge: unknown = undefined;
  private _timeline = new TimelineView();
  private _title = h('div', { class: 'jp-GpuMem-title' });
  private _kernelLine = h('div', { class: 'jp-GpuMem-kernel' });
  private _deviceSelect = h('select', {
    class: 'jp-GpuMem-device-select'
  }) as HTMLSelectElement;
  private _status = h('div', { class: 'jp-GpuMem-status' });
  private _devicesBox = h('div', { class: 'jp-GpuMem-section' });
  private _timelineBox = h('div', { class: 'jp-GpuMem-section' });
  private _holdersBox = h('div', { class: 'jp-GpuMem-section' });
  private _notesBox = h('div', { class: 'jp-GpuMem-holderNotes' });
  private _table = new HoldersTable((names, checked) =>
    this.model.toggleMany(names, checked)
  );
  private _stale = h('div', {
    class: 'jp-GpuMem-notice jp-GpuMem-staleNote',
    role: 'status'
  });
  private _purgeButton = h('button', {
    class: 'jp-GpuMem-button jp-mod-warn jp-GpuMem-purge'
  }) as HTMLButtonElement;
  private _resultBox = h('div', { class: 'jp-GpuMem-section' });
}

/** `the purge` -> `The purge`. */
function capitalize(text: string): string {
  return text.charAt(0).toUpperCase() + text.slice(1);
}

/** A request in words, for the status lines. */
function describeRequest(type: string, id?: unknown): string {
  if (id === 'open') {
    return 'the opening of its link';
  }
  switch (type) {
    case 'purge':
      return 'the purge';
    case 'refresh':
      return 'the scan';
    case 'set_device':
      return 'the device choice';
    default:
      return `"${type}"`;
  }
}

/** Options of the sidebar. */
export namespace GpuMemSidebar {
  export interface IOptions {
    model: SidebarModel;
    channel: KernelChannel;
    confirmPurge: ConfirmPurge;
    /** Refresh interval of the holders while idle, in ms. */
    refreshInterval?: number;
  }
}
