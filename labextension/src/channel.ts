/**
 * The link between the sidebar and the kernel of the notebook in focus: one
 * comm on target `jupyter_gpumem`, reopened across kernel restarts and
 * changes, closed when focus moves elsewhere.
 */
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import type { IDisposable } from '@lumino/disposable';
import type { ISignal } from '@lumino/signaling';

import {
  COMM_TARGET,
  LOAD_EXTENSION_CODE,
  PURGE_SNAPSHOT_WAIT_MS
} from './constants';
import { SidebarModel } from './model';
import { parseKernelMessage, Requests, SidebarRequest } from './protocol';

/** The part of a kernel connection the channel uses. */
export type IKernelLike = Pick<
  Kernel.IKernelConnection,
  'id' | 'status' | 'createComm' | 'requestExecute'
>;

/**
 * The part of a session context the channel uses (a notebook's or a
 * console's `sessionContext` is one).
 */
export interface ISessionLike {
  readonly session: { readonly kernel: IKernelLike | null } | null;
  readonly kernelChanged: ISignal<any, any>;
  readonly statusChanged: ISignal<any, Kernel.Status>;
  readonly iopubMessage: ISignal<any, KernelMessage.IMessage>;
  readonly disposed: ISignal<any, void>;
  readonly isDisposed: boolean;
}

/**
 * Keeps one comm open to the kernel of the followed session and feeds what
 * arrives into the model.
 */
export class KernelChannel implements IDisposable {
  constructor(model: SidebarModel) {
    this.model = model;
  }

  /** The model this channel feeds. */
  readonly model: SidebarModel;

  /** The session followed now, or null. */
  get session(): ISessionLike | null {
    return this._session;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /**
   * Follow another session (null: none). Closes the comm to the previous
   * kernel, so its sampling thread stops.
   */
  follow(session: ISessionLike | null, label: string): void {
    if (session === this._session) {
      return;
    }
    this._unwatch();
    this._closeComm(true);
    this._session = session;
    this._reconnectOnIdle = false;
    this._executedSinceCheck = false;
    this.model.reset(session ? 'connecting' : 'no-kernel', label);
    if (session) {
      session.kernelChanged.connect(this._onKernelChanged, this);
      session.statusChanged.connect(this._onStatusChanged, this);
      session.iopubMessage.connect(this._onIopub, this);
      session.disposed.connect(this._onSessionDisposed, this);
      this._connect();
    }
  }

  /**
   * Run `%load_ext jupyter_gpumem` silently in the followed kernel (only
   * ever called from the explicit button), then open the comm again.
   */
  async loadExtension(): Promise<void> {
    const kernel = this._kernel();
    if (!kernel) {
      return;
    }
    this.model.setState('loading');
    try {
      const future = kernel.requestExecute({
        code: LOAD_EXTENSION_CODE,
        silent: true,
        store_history: false,
        allow_stdin: false,
        stop_on_error: false
      });
      const reply = await future.done;
      if (kernel !== this._kernel()) {
        return;
      }
      const content = reply.content;
      if (content.status === 'ok') {
        this._connect();
      } else if (content.status === 'error') {
        this.model.setState(
          'not-loaded',
          `Loading failed: ${content.ename}: ${content.evalue}`
        );
      } else {
        this.model.setState('not-loaded', 'Loading was aborted.');
      }
    } catch (reason) {
      if (kernel === this._kernel()) {
        this.model.setState('not-loaded', `Loading failed: ${String(reason)}`);
      }
    }
  }

  /** Ask for a fresh snapshot. False when there is no open link. */
  refresh(): boolean {
    return this._send(id => Requests.refresh(id));
  }

  /**
   * Ask for a fresh snapshot when the kernel is idle (a request sent while a
   * cell runs would only queue behind it; the kernel pushes one after each
   * cell anyway).
   */
  refreshIfIdle(): boolean {
    const kernel = this._kernel();
    if (!kernel || kernel.status !== 'idle') {
      return false;
    }
    return this.refresh();
  }

  /** Ask the kernel to purge these names (holder `purge` values). */
  purge(names: string[], dryRun = false): boolean {
    if (names.length === 0) {
      return false;
    }
    return this._send(id => Requests.purge(id, names, dryRun));
  }

  /** Change the device selection and ask the kernel for it. */
  setDevice(device: string): void {
    this.model.setDevice(device);
    this._send(id => Requests.setDevice(id, device));
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    this._clearAfterPurge();
    this._unwatch();
    this._closeComm(true);
    this._session = null;
  }

  private _kernel(): IKernelLike | null {
    return this._session?.session?.kernel ?? null;
  }

  /** Send a request built with the next id, if the link is open. */
  private _send(make: (id: number) => SidebarRequest): boolean {
    const comm = this._comm;
    if (!comm || comm.isDisposed || this.model.state !== 'ready') {
      return false;
    }
    this._lastId += 1;
    const request = make(this._lastId);
    try {
      const future = comm.send(request as any);
      future.done.catch(() => undefined);
      return true;
    } catch (reason) {
      this.model.setError(
        `Could not send "${request.type}": ${String(reason)}`
      );
      return false;
    }
  }

  private _connect(): void {
    this._closeComm(true);
    const kernel = this._kernel();
    if (!kernel) {
      this.model.setState('no-kernel');
      return;
    }
    if (kernel.status === 'dead') {
      this.model.setState('dead');
      return;
    }
    this.model.setState('connecting');
    let comm: Kernel.IComm;
    try {
      comm = kernel.createComm(COMM_TARGET);
    } catch (reason) {
      this.model.setState('not-loaded', String(reason));
      return;
    }
    const generation = this._generation;
    comm.onMsg = msg => {
      if (generation === this._generation) {
        this._onData(msg.content.data);
      }
    };
    comm.onClose = () => {
      if (generation !== this._generation) {
        return;
      }
      this._comm = null;
      this._generation += 1;
      this.model.setState(this.model.state === 'dead' ? 'dead' : 'not-loaded');
    };
    this._comm = comm;
    try {
      comm.open({}).done.catch(() => undefined);
    } catch (reason) {
      this._comm = null;
      this.model.setState('not-loaded', String(reason));
    }
  }

  private _onData(data: unknown): void {
    const parsed = parseKernelMessage(data);
    if (!parsed.ok) {
      this.model.setError(parsed.reason);
      return;
    }
    const message = parsed.message;
    this.model.handle(message);
    if (message.type === 'hello') {
      this._send(id => Requests.setDevice(id, this.model.device));
    } else if (message.type === 'snapshot') {
      this._clearAfterPurge();
    } else if (message.type === 'purge_result' && !message.result.dry_run) {
      // the kernel pushes the snapshot after a purge; if none comes, ask for it
      this._clearAfterPurge();
      this._afterPurge = setTimeout(() => {
        this._afterPurge = null;
        this.refresh();
      }, PURGE_SNAPSHOT_WAIT_MS);
    }
  }

  private _clearAfterPurge(): void {
    if (this._afterPurge !== null) {
      clearTimeout(this._afterPurge);
      this._afterPurge = null;
    }
  }

  /** Forget the comm; with `sendClose`, tell the kernel too. */
  private _closeComm(sendClose: boolean): void {
    const comm = this._comm;
    this._comm = null;
    this._generation += 1;
    if (comm && sendClose && !comm.isDisposed) {
      try {
        comm.close().done.catch(() => undefined);
      } catch {
        // The kernel is gone already: nothing to tell.
      }
    }
  }

  private _onKernelChanged(): void {
    this._closeComm(false);
    this._reconnectOnIdle = false;
    this.model.reset('connecting', this.model.kernelLabel);
    this._connect();
  }

  private _onStatusChanged(_: unknown, status: Kernel.Status): void {
    switch (status) {
      case 'restarting':
      case 'autorestarting':
        this._closeComm(false);
        this._reconnectOnIdle = true;
        this.model.reset('connecting', this.model.kernelLabel);
        break;
      case 'dead':
        this._closeComm(false);
        this._reconnectOnIdle = true;
        this.model.setState('dead');
        break;
      case 'idle':
        this.model.cellEnded(Date.now() / 1000);
        if (this._reconnectOnIdle) {
          this._reconnectOnIdle = false;
          this._connect();
        } else if (
          this._executedSinceCheck &&
          this.model.state === 'not-loaded'
        ) {
          // A cell ran since the kernel said "not loaded": it may have
          // loaded the extension itself.
          this._executedSinceCheck = false;
          this._connect();
        }
        break;
      default:
        break;
    }
  }

  private _onIopub(_: unknown, msg: KernelMessage.IMessage): void {
    if (msg.header.msg_type === 'execute_input') {
      this._executedSinceCheck = true;
      this.model.cellStarted(Date.now() / 1000);
    }
  }

  private _onSessionDisposed(): void {
    this.follow(null, '');
  }

  private _unwatch(): void {
    const session = this._session;
    if (!session) {
      return;
    }
    session.kernelChanged.disconnect(this._onKernelChanged, this);
    session.statusChanged.disconnect(this._onStatusChanged, this);
    session.iopubMessage.disconnect(this._onIopub, this);
    session.disposed.disconnect(this._onSessionDisposed, this);
  }

  private _session: ISessionLike | null = null;
  private _comm: Kernel.IComm | null = null;
  private _generation = 0;
  private _lastId = 0;
  private _reconnectOnIdle = false;
  private _executedSinceCheck = false;
  private _isDisposed = false;
  private _afterPurge: ReturnType<typeof setTimeout> | null = null;
}
