/**
 * What the Kernels section asks of JupyterLab: the server's endpoints (through
 * its authenticated ServerConnection), the document manager, the kernel API,
 * a kernel's own `jupyter_gpumem` comm, and a confirmation dialog.
 */
import type { JupyterFrontEnd } from '@jupyterlab/application';
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { ServerConnection } from '@jupyterlab/services';
import type { Kernel } from '@jupyterlab/services';
import { DisposableSet } from '@lumino/disposable';
import { Widget } from '@lumino/widgets';

import { h } from './dom';
import { formatByteMap } from './format';
import type { IKernelsBackend } from './kernels';

const COMM_TARGET = 'jupyter_gpumem';
const REPLY_TIMEOUT_MS = 15000;
const PURGE_TIMEOUT_MS = 120000;

async function confirm(
  title: string,
  text: string,
  label: string
): Promise<boolean> {
  const result = await showDialog({
    title,
    body: new Widget({ node: h('p', { class: 'jp-GpuMem-confirm' }, text) }),
    buttons: [Dialog.cancelButton(), Dialog.warnButton({ label })],
    // Enter keeps what the user has: the destructive button needs a click
    defaultButton: 0
  });
  return result.button.accept;
}

/** Messages of one comm, awaited one condition at a time. */
class CommReplies {
  constructor(comm: Kernel.IComm) {
    comm.onMsg = msg => {
      this._messages.push(msg.content.data as { [k: string]: unknown });
      this._wake();
    };
    comm.onClose = () => {
      this.closed = true;
      this._wake();
    };
  }

  closed = false;

  async next(
    test: (m: { [k: string]: unknown }) => boolean,
    timeout: number
  ): Promise<{ [k: string]: unknown } | null> {
    const deadline = Date.now() + timeout;
    for (;;) {
      const i = this._messages.findIndex(test);
      if (i >= 0) {
        return this._messages.splice(i, 1)[0];
      }
      if (this.closed || Date.now() >= deadline) {
        return null;
      }
      await new Promise<void>(resolve => {
        this._wake = resolve;
        setTimeout(resolve, Math.max(deadline - Date.now(), 0));
      });
    }
  }

  private _messages: { [k: string]: unknown }[] = [];
  private _wake: () => void = () => undefined;
}

/** Purge a kernel's hidden holders through its own comm (confirmed first). */
export async function purgeHiddenThroughComm(
  kernels: Kernel.IManager,
  id: string,
  name: string | null,
  ask: (title: string, text: string, label: string) => Promise<boolean>
): Promise<string> {
  const connection = kernels.connectTo({ model: { id, name: name ?? '' } });
  const owned = new DisposableSet();
  owned.add(connection);
  const comm = connection.createComm(COMM_TARGET);
  owned.add(comm);
  try {
    const replies = new CommReplies(comm);
    comm.open({});
    const hello = await replies.next(m => m.type === 'hello', REPLY_TIMEOUT_MS);
    if (!hello) {
      return 'That kernel has not loaded jupyter_gpumem: run %load_ext jupyter_gpumem in it.';
    }
    // every device: a hidden holder (Out[12], the last traceback) may hold host
    // memory too, and the purge that follows goes on this comm's selection
    comm.send({ type: 'set_device', id: 'kernels-refresh', device: 'all' });
    const reply = await replies.next(
      m => m.reply_to === 'kernels-refresh',
      REPLY_TIMEOUT_MS
    );
    const snapshot = reply?.snapshot as
      { holders?: { hidden?: boolean; purge?: string | null }[] } | undefined;
    if (!snapshot) {
      return 'That kernel did not answer (busy?): try again when it is idle.';
    }
    const names = (snapshot.holders ?? [])
      .filter(x => x.hidden && x.purge)
      .map(x => x.purge as string);
    if (names.length === 0) {
      return 'No hidden holder in that kernel holds memory.';
    }
    const ok = await ask(
      'Purge the hidden holders?',
      `Delete ${names.join(', ')} from that kernel and release the framework caches.`,
      'Purge'
    );
    if (!ok) {
      return 'Nothing purged.';
    }
    comm.send({ type: 'purge', id: 'kernels-purge', names });
    const result = await replies.next(
      m => m.reply_to === 'kernels-purge',
      PURGE_TIMEOUT_MS
    );
    if (!result) {
      return 'The purge did not answer in time.';
    }
    if (result.type === 'error') {
      return `Purge failed: ${String(result.message)}`;
    }
    const freed = (result.result as { freed?: { [d: string]: number } }).freed;
    return `Purged ${names.join(', ')}: freed ${formatByteMap(freed ?? {})}.`;
  } finally {
    if (!comm.isDisposed) {
      try {
        comm.close();
      } catch {
        // the kernel closed it already
      }
    }
    owned.dispose();
  }
}

/** The Kernels section's backend for this JupyterLab. */
export function labKernelsBackend(app: JupyterFrontEnd): IKernelsBackend {
  const services = app.serviceManager;
  const settings = services.serverSettings;
  return {
    async request(path: string, body?: unknown): Promise<unknown> {
      const base = settings.baseUrl;
      const url = (base.endsWith('/') ? base : base + '/') + path;
      const init: RequestInit =
        body === undefined
          ? { method: 'GET' }
          : { method: 'POST', body: JSON.stringify(body) };
      const response = await ServerConnection.makeRequest(url, init, settings);
      if (!response.ok) {
        throw new ServerConnection.ResponseError(response);
      }
      return response.json();
    },
    async open(path: string): Promise<void> {
      await app.commands.execute('docmanager:open', { path });
    },
    async shutdown(kernelId: string): Promise<void> {
      await services.kernels.shutdown(kernelId);
    },
    purgeHidden: (id, name) =>
      purgeHiddenThroughComm(services.kernels, id, name, confirm),
    confirm
  };
}
