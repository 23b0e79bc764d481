/**
 * The sidebar's "Kernels" section: every notebook of the server that holds
 * GPU memory, largest first, and the processes on the GPUs that are no
 * kernel of the server (orphans of restarted kernels first), from the server
 * extension's `GET api/gpumem/kernels` (docs/PROTOCOL.md, "Server
 * extension"). Buttons: open the notebook, purge its hidden holders (through
 * that kernel's own `jupyter_gpumem` comm), shut its kernel down (the
 * server's kernel API), end the orphans (`POST api/gpumem/orphans`); each
 * that changes something asks first.
 */
import { h } from './dom';
import { formatBytes } from './format';
import type { IServerReading } from './kernelView';
import type { IOtherProcess, IServerKernel, IServerKernels } from './protocol';
import { endServerOrphans, readServerKernels, ServerRequest } from './request';

/** What the section needs from JupyterLab (given by activate.ts; faked in tests). */
export interface IKernelsBackend {
  /** GET (no body) or POST (a JSON body) a path under the server's base URL. */
  request: ServerRequest;
  open(path: string): Promise<void>;
  shutdown(kernelId: string): Promise<void>;
  /** Purge the kernel's hidden holders through its comm; a line saying what happened. */
  purgeHidden(kernelId: string, kernelName: string | null): Promise<string>;
  confirm(title: string, text: string, label: string): Promise<boolean>;
}

/** What the section says where the server has no GPU figures. */
export const NO_NVML_MESSAGE =
  'GPU figures need NVML (the NVIDIA driver); none here';

/**
 * The server's line about missing GPU figures, in plain words: a raw NVML
 * error (`NVMLError_LibraryNotFound: ...`) is never shown as it is.
 */
export function plainGpuMessage(message: string | null): string {
  if (!message || /NVMLError|\w+Error\b|Traceback/.test(message)) {
    return NO_NVML_MESSAGE;
  }
  return message;
}

/** Bytes of host memory the server read for a kernel, or null. */
export function hostBytes(k: IServerKernel): number | null {
  const rss = k.host?.rss;
  return typeof rss === 'number' ? rss : null;
}

/** The kernels that hold GPU memory, largest first. */
export function holdingKernels(data: IServerKernels): IServerKernel[] {
  return data.kernels
    .filter(k => (k.gpu_bytes ?? 0) > 0)
    .sort((a, b) => b.gpu_bytes - a.gpu_bytes);
}

function basename(path: string | null): string {
  if (!path) {
    return '(no notebook)';
  }
  const i = path.lastIndexOf('/');
  return i >= 0 ? path.slice(i + 1) : path;
}

export class KernelsSection {
  constructor(backend: IKernelsBackend) {
    this._backend = backend;
    const refresh = h(
      'button',
      {
        class: 'jp-GpuMem-button jp-GpuMem-kernelsRefresh',
        title: "Ask the server again for its kernels' memory"
      },
      'Reload kernels'
    );
    refresh.addEventListener('click', () => void this.refresh());
    this.node = h(
      'div',
      { class: 'jp-GpuMem-kernels' },
      h('h3', { class: 'jp-GpuMem-kernelsTitle' }, 'Kernels', refresh),
      this._body,
      this._status
    );
  }

  readonly node: HTMLElement;

  /** The last answer (null before the first, or after a failure). */
  get data(): IServerKernels | null {
    return this._data;
  }

  /** Ask the endpoint and draw the answer. */
  async refresh(): Promise<void> {
    try {
      this._data = await readServerKernels(this._request);
      this._error = null;
    } catch (reason) {
      this._data = null;
      this._error = `The server extension did not answer: ${String(
        (reason as Error)?.message ?? reason
      )}`;
    }
    this._render();
  }

  /** Show one line under the section (what a button did). */
  say(text: string): void {
    this._status.textContent = text;
  }

  async openNotebook(k: IServerKernel): Promise<void> {
    if (k.path) {
      await this._backend.open(k.path);
    }
  }

  async shutdown(k: IServerKernel): Promise<boolean> {
    const host = hostBytes(k);
    const held =
      k.gpu_bytes > 0 || host === null
        ? `${formatBytes(k.gpu_bytes)} on the GPUs`
        : `${formatBytes(host)} of host memory`;
    const ok = await this._backend.confirm(
      'Shut the kernel down?',
      `Shut down the kernel of ${k.path ?? k.id}: everything it holds ` +
        `(${held}) is lost, and its unsaved state with it.`,
      'Shut down'
    );
    if (!ok) {
      return false;
    }
    await this._backend.shutdown(k.id);
    this.say(`Shut down the kernel of ${k.path ?? k.id}.`);
    await this.refresh();
    return true;
  }

  async purgeHidden(k: IServerKernel): Promise<string> {
    let line: string;
    try {
      line = await this._backend.purgeHidden(k.id, k.name);
    } catch (reason) {
      line = `Purge failed: ${String((reason as Error)?.message ?? reason)}`;
    }
    this.say(line);
    await this.refresh();
    return line;
  }

  async endOrphans(): Promise<boolean> {
    const orphans = this._data?.orphans.filter(p => p.purgeable) ?? [];
    if (orphans.length === 0) {
      return false;
    }
    const total = orphans.reduce((s, p) => s + (p.bytes ?? 0), 0);
    const ok = await this._backend.confirm(
      'End the orphans?',
      `End ${orphans.length} orphaned process(es) that a kernel left ` +
        `(pid ${orphans.map(p => p.pid).join(', ')}), holding ${formatBytes(total)}: ` +
        'SIGTERM, then SIGKILL after a grace period.',
      'End them'
    );
    if (!ok) {
      return false;
    }
    const result = await endServerOrphans(this._request, false);
    const ended = new Set(
      (result.steps ?? []).filter(s => s.result === 'ended').map(s => s.pid)
    );
    const freed = Object.values(result.freed ?? {}).reduce((s, n) => s + n, 0);
    this.say(
      `Ended ${ended.size} of ${orphans.length} orphan(s); the GPUs got ${formatBytes(freed)} back.`
    );
    await this.refresh();
    return true;
  }

  private _render(): void {
    const body = this._body;
    body.textContent = '';
    if (this._error) {
      body.append(h('div', { class: 'jp-GpuMem-kernelsError' }, this._error));
      return;
    }
    const data = this._data;
    if (!data) {
      return;
    }
    if (!data.gpu) {
      body.append(
        h(
          'div',
          { class: 'jp-GpuMem-kernelsNone' },
          plainGpuMessage(data.message)
        )
      );
      const kernels = [...data.kernels].sort(
        (a, b) => (hostBytes(b) ?? -1) - (hostBytes(a) ?? -1)
      );
      for (const k of kernels) {
        body.append(this._kernelRow(k, false));
      }
      if (kernels.length === 0) {
        body.append(
          h(
            'div',
            { class: 'jp-GpuMem-kernelsIdle' },
            'No kernel runs on this server.'
          )
        );
      }
      return;
    }
    const holding = holdingKernels(data);
    for (const k of holding) {
      body.append(this._kernelRow(k));
    }
    const idle = data.kernels.length - holding.length;
    if (holding.length === 0) {
      body.append(
        h(
          'div',
          { class: 'jp-GpuMem-kernelsNone' },
          'No kernel of this server holds GPU memory.'
        )
      );
    }
    if (idle > 0) {
      body.append(
        h(
          'div',
          { class: 'jp-GpuMem-kernelsIdle' },
          `${idle} other kernel(s) hold no GPU memory.`
        )
      );
    }
    if (data.orphans.length > 0) {
      body.append(this._orphansBox(data.orphans));
    }
    const rest = data.others.filter(p => p.relation !== 'orphan');
    if (rest.length > 0) {
      body.append(
        h('div', { class: 'jp-GpuMem-kernelsSub' }, 'Other processes'),
        ...rest.map(p => this._processRow(p))
      );
    }
  }

  private _kernelRow(k: IServerKernel, gpu = true): HTMLElement {
    const open = h(
      'button',
      {
        class: 'jp-GpuMem-button jp-GpuMem-srvKernelOpen',
        title: `Open ${k.path ?? ''}`
      },
      'Open'
    );
    if (!k.path) {
      open.setAttribute('disabled', '');
    }
    open.addEventListener('click', () => void this.openNotebook(k));
    const purge = h(
      'button',
      {
        class: 'jp-GpuMem-button jp-GpuMem-srvKernelPurge',
        title:
          "Purge the kernel's hidden holders (output history, last traceback) through its jupyter_gpumem comm"
      },
      'Purge hidden'
    );
    purge.addEventListener('click', () => void this.purgeHidden(k));
    const stop = h(
      'button',
      {
        class: 'jp-GpuMem-button jp-mod-warn jp-GpuMem-srvKernelShutdown',
        title: 'Shut the kernel down'
      },
      'Shut down'
    );
    stop.addEventListener('click', () => void this.shutdown(k));
    const who =
      k.pid !== null
        ? `pid ${k.pid}` +
          (k.children.length ? ` · ${k.children.length} child(ren)` : '')
        : (k.pid_note ?? 'pid unknown');
    const host = hostBytes(k);
    const devices = [
      ...Object.entries(k.gpu ?? {}).map(([d, n]) => `${d} ${formatBytes(n)}`),
      ...(host !== null ? [`host ${formatBytes(host)}`] : [])
    ].join(', ');
    const shown = gpu ? k.gpu_bytes : host;
    return h(
      'div',
      { class: 'jp-GpuMem-srvKernel', 'data-kernel-id': k.id },
      h(
        'div',
        { class: 'jp-GpuMem-srvKernelHead' },
        h(
          'span',
          { class: 'jp-GpuMem-srvKernelPath', title: k.path ?? k.id },
          basename(k.path)
        ),
        h(
          'span',
          {
            class: 'jp-GpuMem-srvKernelBytes',
            title: gpu ? 'on the GPUs' : 'host memory (resident, with children)'
          },
          shown === null ? 'n/a' : formatBytes(shown)
        )
      ),
      h(
        'div',
        { class: 'jp-GpuMem-srvKernelWho' },
        [who, k.execution_state, devices].filter(Boolean).join(' · ')
      ),
      h('div', { class: 'jp-GpuMem-srvKernelActions' }, open, purge, stop)
    );
  }

  private _orphansBox(orphans: IOtherProcess[]): HTMLElement {
    const total = orphans.reduce((s, p) => s + (p.bytes ?? 0), 0);
    const end = h(
      'button',
      {
        class: 'jp-GpuMem-button jp-mod-warn jp-GpuMem-orphansEnd',
        title: "End this user's orphans that a kernel left"
      },
      'End orphans'
    );
    if (!orphans.some(p => p.purgeable)) {
      end.setAttribute('disabled', '');
    }
    end.addEventListener('click', () => void this.endOrphans());
    return h(
      'div',
      { class: 'jp-GpuMem-orphans' },
      h(
        'div',
        { class: 'jp-GpuMem-kernelsSub' },
        `Orphans: ${orphans.length} process(es), ${formatBytes(total)} `,
        end
      ),
      ...orphans.map(p => this._processRow(p))
    );
  }

  private _processRow(p: IOtherProcess): HTMLElement {
    return h(
      'div',
      {
        class: 'jp-GpuMem-process',
        title: p.command,
        'data-pid': String(p.pid)
      },
      h('span', { class: 'jp-GpuMem-processPid' }, `pid ${p.pid}`),
      h('span', { class: 'jp-GpuMem-processBytes' }, formatBytes(p.bytes)),
      h('span', { class: 'jp-GpuMem-processLabel' }, `${p.device} · ${p.label}`)
    );
  }

  private _backend: IKernelsBackend;
  private _request: ServerRequest = (path, body) =>
    this._backend.request(path, body);
  private _data: IServerKernels | null = null;
  private _error: string | null = null;
  private _body = h('div', { class: 'jp-GpuMem-kernelsBody' });
  private _status = h('div', { class: 'jp-GpuMem-kernelsStatus' });
}

/**
 * Reads one kernel's figures from the endpoint (for a kernel whose comm is not
 * open yet): its host memory and its bytes per GPU.
 */
export function serverReader(
  backend: Pick<IKernelsBackend, 'request'>
): (kernelId: string) => Promise<IServerReading | null> {
  return async kernelId => {
    const data = await readServerKernels((path, body) =>
      backend.request(path, body)
    );
    const k = data.kernels.find(one => one.id === kernelId);
    if (!k) {
      return null;
    }
    return {
      time: Date.now() / 1000,
      rss: hostBytes(k),
      gpu: data.gpu ? { ...(k.gpu ?? {}) } : {},
      message: data.gpu ? null : plainGpuMessage(data.message)
    };
  };
}
