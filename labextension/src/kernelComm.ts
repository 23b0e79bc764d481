/**
 * A kernel's own `jupyter_gpumem` comm, opened for one job and closed after
 * it: the Kernels section purges the hidden holders (`Out[N]`, the last
 * traceback) of a kernel that is not the one the sidebar follows. The
 * sidebar's own link to the kernels (one comm each, kept open) is channel.ts.
 */
import type { Kernel } from '@jupyterlab/services';
import { DisposableSet } from '@lumino/disposable';

import { COMM_TARGET } from './constants';
import { formatByteMap } from './format';
import { Requests } from './protocol';

/** How long the kernel has to say `hello` and to answer the refresh, in ms. */
const REPLY_TIMEOUT_MS = 15000;
/** How long the purge may take, in ms. */
const PURGE_TIMEOUT_MS = 120000;
/** Ids of this job's two requests. */
const REFRESH_ID = 'kernels-refresh';
const PURGE_ID = 'kernels-purge';

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

/**
 * Purge a kernel's hidden holders through its own comm (confirmed first).
 *
 * `open` is a connection to that kernel this JupyterLab holds already (a
 * notebook's or a console's): the comm goes on it, since a second connection
 * to a kernel whose comms one handles gets none. Otherwise a connection is
 * opened for the job, and closed after it.
 */
export async function purgeHiddenThroughComm(
  kernels: Kernel.IManager,
  id: string,
  name: string | null,
  ask: (title: string, text: string, label: string) => Promise<boolean>,
  open: Kernel.IKernelConnection | null = null
): Promise<string> {
  const owned = new DisposableSet();
  let connection = open;
  if (!connection || connection.isDisposed || !connection.handleComms) {
    connection = kernels.connectTo({ model: { id, name: name ?? '' } });
    owned.add(connection);
  }
  // closed in `finally`, once, before the connection: not in `owned`, which
  // would dispose it a second time (releasing its share of a subshell twice)
  // eslint-disable-next-line jupyter/require-disposable-transfer
  const comm = connection.createComm(COMM_TARGET);
  try {
    const replies = new CommReplies(comm);
    comm.open({});
    const hello = await replies.next(m => m.type === 'hello', REPLY_TIMEOUT_MS);
    if (!hello) {
      return 'That kernel has not loaded jupyter_gpumem: run %load_ext jupyter_gpumem in it.';
    }
    // every device: a hidden holder (Out[12], the last traceback) may hold host
    // memory too, and the purge that follows goes on this comm's selection
    comm.send({ ...Requests.setDevice(REFRESH_ID, 'all') });
    const reply = await replies.next(
      m => m.reply_to === REFRESH_ID,
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
    comm.send({ ...Requests.purge(PURGE_ID, names) });
    const result = await replies.next(
      m => m.reply_to === PURGE_ID,
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
        comm.dispose(); // the kernel closed it already
      }
    }
    owned.dispose();
  }
}
