/**
 * The status bar item (as jupyter-resource-usage's): the memory of the
 * kernel in focus on its device (host memory where there is no GPU), in the
 * warning colour past the warning share; a click opens the sidebar.
 */
import { Widget } from '@lumino/widgets';

import { DEFAULT_WARN_SHARE } from './constants';
import { formatBytes } from './format';
import { SidebarModel } from './model';
import { IDeviceUsage } from './protocol';

/** What the item says, its tooltip, and whether it warns. */
export function statusText(
  model: SidebarModel,
  warnShare: number = DEFAULT_WARN_SHARE
): { text: string; title: string; warn: boolean } {
  const devices: ReadonlyArray<IDeviceUsage> = model.devices;
  const gpus = devices.filter(d => d.kind !== 'cpu');
  const shown = gpus.length ? gpus : devices.filter(d => d.kind === 'cpu');
  if (model.state !== 'ready' || shown.length === 0) {
    const reading = model.serverReading;
    if (reading && reading.rss !== null) {
      return {
        text: `Kernel: host ${formatBytes(reading.rss)}`,
        title: `${model.kernelLabel}: the server's reading (the kernel runs a cell)`,
        warn: false
      };
    }
    return {
      text: 'Kernel memory: –',
      title: model.kernelLabel
        ? `${model.kernelLabel}: no reading yet`
        : 'No notebook in focus',
      warn: false
    };
  }
  let warn = false;
  const parts: string[] = [];
  const lines: string[] = [];
  for (const d of shown) {
    const mine = d.used_process ?? d.allocated ?? null;
    const used =
      d.total !== null && d.free !== null ? d.total - d.free : d.used_all;
    const share = d.total && used !== null ? used / d.total : null;
    if (share !== null && share >= warnShare) {
      warn = true;
    }
    const label = d.kind === 'cpu' ? 'Host' : d.id;
    parts.push(
      `${label} ${formatBytes(mine)}${d.total ? ` / ${formatBytes(d.total)}` : ''}`
    );
    lines.push(
      `${d.id}: this kernel ${formatBytes(mine)}` +
        (share !== null
          ? `; the device is ${Math.round(share * 100)}% full (warning at ${Math.round(warnShare * 100)}%)`
          : '')
    );
  }
  return {
    text: parts.join(' · '),
    title: [`Memory of ${model.kernelLabel}`, ...lines].join('\n'),
    warn
  };
}

/** The item: a text that follows the model. */
export class MemoryStatusItem extends Widget {
  constructor(model: SidebarModel, onClick: () => void) {
    super();
    this.addClass('jp-GpuMem-statusItem');
    this.node.setAttribute('role', 'button');
    this.node.tabIndex = 0;
    this._model = model;
    this.node.addEventListener('click', () => onClick());
    this.node.addEventListener('keydown', event => {
      if (event.key === 'Enter' || event.key === ' ') {
        event.preventDefault();
        onClick();
      }
    });
    model.changed.connect(this.refresh, this);
    this.refresh();
  }

  /** Share of a device in use past which the item warns (a setting). */
  get warnShare(): number {
    return this._warnShare;
  }

  set warnShare(share: number) {
    this._warnShare = share;
    this.refresh();
  }

  /** Draw what the model says now. */
  refresh(): void {
    const { text, title, warn } = statusText(this._model, this._warnShare);
    if (this.node.textContent !== text) {
      this.node.textContent = text;
    }
    this.node.title = title;
    this.node.classList.toggle('jp-GpuMem-mod-warn', warn);
  }

  dispose(): void {
    if (!this.isDisposed) {
      this._model.changed.disconnect(this.refresh, this);
    }
    super.dispose();
  }

  private _model: SidebarModel;
  private _warnShare = DEFAULT_WARN_SHARE;
}
