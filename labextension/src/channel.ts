/**
 * The links between the sidebar and the kernels: one comm on target
 * `jupyter_gpumem` per kernel, opened the first time its notebook is in focus
 * and kept open for the session (reused at every focus change; closed only
 * when the kernel shuts down, restarts or changes). Every request is
 * answered, queued or, after `ANSWER_TIMEOUT_MS`, shown as unanswered with
 * Retry: never silent.
 */
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import type { IDisposable } from '@lumino/disposable';
import type { ISignal } from '@lumino/signaling';

import {
  ANSWER_TIMEOUT_MS,
  COMM_TARGET,
  LOAD_EXTENSION_CODE,
  OLD_PURGE_NAMES_MAX,
  PURGE_SNAPSHOT_WAIT_MS,
  SERVER_READINGS_INTERVAL_MS
} from './constants';
import { IServerReading } from './kernelView';
import { SidebarModel } from './model';
import {
  IPurgeResult,
  IPurgeResultMessage,
  parseKernelMessage,
  RequestId,
  Requests,
  SidebarRequest
} from './protocol';

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

/** Reads the server's figures of a kernel (`api/gpumem/kernels`); null: none. */
export type ServerReader = (kernelId: string) => Promise<IServerReading | null>;

/** Id of the pseudo-request that stands for the comm's opening. */
const OPEN_ID = 'open';

/** A purge split for an older kernel (at most 256 names a request): its parts. */
interface IBatch {
  ids: RequestId[];
  results: IPurgeResult[];
}

/** One kernel's link: its session, comm and timers. */
interface ILink {
  key: string;
  session: ISessionLike;
  comm: Kernel.IComm | null;
  generation: number;
  reconnectOnIdle: boolean;
  executedSinceCheck: boolean;
  afterPurge: ReturnType<typeof setTimeout> | null;
  timers: Map<RequestId, ReturnType<typeof setTimeout>>;
  batches: IBatch[];
  /** The device selection last asked of this kernel. */
  device: string | null;
  onKernelChanged: () => void;
  onStatus: (_: unknown, status: Kernel.Status) => void;
  onIopub: (_: unknown, msg: KernelMessage.IMessage) => void;
  onDisposed: () => void;
}

/**
 * Keeps one comm open per kernel followed and feeds what arrives into the
 * model (each kernel's view of it).
 */
export class KernelChannel implements IDisposable {
  constructor(model: SidebarModel, readServer: ServerReader | null = null) {
    this.model = model;
    this._readServer = readServer;
  }

  /** The model this channel feeds. */
  readonly model: SidebarModel;

  /** The session followed now, or null. */
  get session(): ISessionLike | null {
    return this._current?.session ?? null;
  }

  /** The kernel of the session followed now, or null. */
  get kernel(): IKernelLike | null {
    return this._current ? this._kernel(this._current) : null;
  }

  /** How many kernels have a comm open now. */
  get openComms(): number {
    return [...this._links.values()].filter(l => l.comm && !l.comm.isDisposed)
      .length;
  }

  get isDisposed(): boolean {
    return this._isDisposed;
  }

  /**
   * Show another session (null: none). The previous kernel's comm stays
   * open (its readings keep coming, its timeline grows); a session followed
   * before comes back with all it had.
   */
  follow(session: ISessionLike | null, label: string): void {
    if (session === (this._current?.session ?? null)) {
      if (this._current) {
        this.model.show(this._current.key, label, 'connecting');
      }
      return;
    }
    if (!session) {
      this._current = null;
      this.model.show(null, label, 'no-kernel');
      return;
    }
    let link = this._links.get(session);
    if (link) {
      this._current = link;
      this.model.show(link.key, label, 'connecting');
      // the device selection may have changed while it was not shown
      if (this.model.state === 'ready' && link.device !== this.model.device) {
        this._sendDevice(link);
      }
    } else {
      link = this._watch(session);
      this._current = link;
      this.model.show(
        link.key,
        label,
        this._kernel(link) ? 'connecting' : 'no-kernel'
      );
      this._connect(link);
    }
    this._pollServer();
  }

  /**
   * Run `%load_ext jupyter_gpumem` silently in the followed kernel (only
   * ever called from the explicit button), then open the comm again.
   */
  async loadExtension(): Promise<void> {
    const link = this._current;
    const kernel = link ? this._kernel(link) : null;
    if (!link || !kernel) {
      return;
    }
    this.model.setState('loading');
    const inLink = (fn: () => void) => this.model.inKernel(link.key, fn);
    try {
      const future = kernel.requestExecute({
        code: LOAD_EXTENSION_CODE,
        silent: true,
        store_history: false,
        allow_stdin: false,
        stop_on_error: false
      });
      const reply = await future.done;
      if (kernel !== this._kernel(link)) {
        return;
      }
      const content = reply.content;
      inLink(() => {
        if (content.status === 'ok') {
          this._connect(link);
        } else if (content.status === 'error') {
          this.model.setState(
            'not-loaded',
            `Loading failed: ${content.ename}: ${content.evalue}`
          );
        } else {
          this.model.setState('not-loaded', 'Loading was aborted.');
        }
      });
    } catch (reason) {
      if (kernel === this._kernel(link)) {
        inLink(() =>
          this.model.setState('not-loaded', `Loading failed: ${String(reason)}`)
        );
      }
    }
  }

  /** Ask for a fresh snapshot. False when there is no open link. */
  refresh(): boolean {
    return this._sendCurrent(id => Requests.refresh(id));
  }

  /**
   * Ask for a fresh snapshot when the kernel is idle (a request sent while a
   * cell runs would only queue behind it; the kernel pushes one after each
   * cell anyway).
   */
  refreshIfIdle(): boolean {
    const kernel = this.kernel;
    if (!kernel || kernel.status !== 'idle') {
      return false;
    }
    return this.refresh();
  }

  /**
   * Ask the kernel to purge these names (holder `purge` values): one
   * request, or parts of 256 names for an older kernel side.
   */
  purge(names: string[], dryRun = false): boolean {
    const link = this._current;
    if (names.length === 0 || !link) {
      return false;
    }
    if (this.model.modern || names.length <= OLD_PURGE_NAMES_MAX) {
      return this._send(link, id => Requests.purge(id, names, dryRun)) !== null;
    }
    const batch: IBatch = { ids: [], results: [] };
    for (let i = 0; i < names.length; i += OLD_PURGE_NAMES_MAX) {
      const part = names.slice(i, i + OLD_PURGE_NAMES_MAX);
      const id = this._send(link, id => Requests.purge(id, part, dryRun));
      if (id === null) {
        return false;
      }
      batch.ids.push(id);
    }
    link.batches.push(batch);
    return true;
  }

  /** Change the device selection and ask the kernel for it. */
  setDevice(device: string): void {
    this.model.setDevice(device);
    if (this._current) {
      this._sendDevice(this._current);
    }
  }

  /** Cancel a queued request (by its id). */
  cancel(id: RequestId): boolean {
    return this._sendCurrent(next => Requests.cancel(next, id));
  }

  /**
   * Ask again what got no answer: the same request with a new id, or the
   * comm's opening again.
   */
  retry(): boolean {
    const link = this._current;
    const missed = this.model.noAnswer;
    if (!link || !missed) {
      return false;
    }
    this.model.clearNoAnswer();
    if (missed.id === OPEN_ID || !link.comm || link.comm.isDisposed) {
      this._connect(link);
      return true;
    }
    const again = missed.request;
    return (
      this._send(link, id => ({ ...again, id }) as SidebarRequest) !== null
    );
  }

  dispose(): void {
    if (this._isDisposed) {
      return;
    }
    this._isDisposed = true;
    for (const link of [...this._links.values()]) {
      this._drop(link, true);
    }
    this._current = null;
    if (this._serverTimer !== null) {
      clearTimeout(this._serverTimer);
      this._serverTimer = null;
    }
  }

  private _kernel(link: ILink): IKernelLike | null {
    return link.session.session?.kernel ?? null;
  }

  private _sendCurrent(make: (id: number) => SidebarRequest): boolean {
    return this._current ? this._send(this._current, make) !== null : false;
  }

  private _sendDevice(link: ILink): void {
    const device = this.model.device;
    if (this._send(link, id => Requests.setDevice(id, device)) !== null) {
      link.device = device;
    }
  }

  /**
   * Send a request built with the next id, if the link is open; it waits for
   * its answer (`ANSWER_TIMEOUT_MS`). Runs on `link`'s view of the model.
   */
  private _send(
    link: ILink,
    make: (id: number) => SidebarRequest
  ): RequestId | null {
    return (
      this.model.inKernel(link.key, () => {
        const comm = link.comm;
        if (!comm || comm.isDisposed || this.model.state !== 'ready') {
          return null;
        }
        this._lastId += 1;
        const request = make(this._lastId);
        try {
          const future = comm.send(request as any);
          future.done.catch(() => undefined);
        } catch (reason) {
          this.model.setError(
            `Could not send "${request.type}": ${String(reason)}`
          );
          return null;
        }
        this.model.requestSent(request);
        this._arm(link, request.id);
        return request.id;
      }) ?? null
    );
  }

  /** Start the answer timer of a request (or of the comm's opening). */
  private _arm(link: ILink, id: RequestId): void {
    const old = link.timers.get(id);
    if (old !== undefined) {
      clearTimeout(old);
    }
    link.timers.set(
      id,
      setTimeout(() => {
        link.timers.delete(id);
        this.model.inKernel(link.key, () => this._timedOut(link, id));
      }, ANSWER_TIMEOUT_MS)
    );
  }

  private _timedOut(link: ILink, id: RequestId): void {
    if (id !== OPEN_ID) {
      this.model.requestTimedOut(id);
      return;
    }
    if (this.model.state !== 'connecting') {
      return;
    }
    const kernel = this._kernel(link);
    if (kernel && kernel.status === 'busy') {
      // an older kernel opens comms between cells: wait for the cell (the
      // server's readings show meanwhile), and look again later
      this._arm(link, OPEN_ID);
      return;
    }
    this.model.requestSent(Requests.hello(OPEN_ID));
    this.model.requestTimedOut(OPEN_ID);
  }

  private _disarm(link: ILink, id: RequestId): void {
    const timer = link.timers.get(id);
    if (timer !== undefined) {
      clearTimeout(timer);
      link.timers.delete(id);
    }
  }

  private _watch(session: ISessionLike): ILink {
    this._keys += 1;
    const link: ILink = {
      key: `k${this._keys}`,
      session,
      comm: null,
      generation: 0,
      reconnectOnIdle: false,
      executedSinceCheck: false,
      afterPurge: null,
      timers: new Map(),
      batches: [],
      device: null,
      onKernelChanged: () =>
        this.model.inKernel(link.key, () => this._onKernelChanged(link)),
      onStatus: (_, status) =>
        this.model.inKernel(link.key, () =>
          this._onStatusChanged(link, status)
        ),
      onIopub: (_, msg) =>
        this.model.inKernel(link.key, () => this._onIopub(link, msg)),
      onDisposed: () => this._drop(link, true)
    };
    session.kernelChanged.connect(link.onKernelChanged);
    session.statusChanged.connect(link.onStatus);
    session.iopubMessage.connect(link.onIopub);
    session.disposed.connect(link.onDisposed);
    this._links.set(session, link);
    return link;
  }

  /** The notebook closed: close its comm, forget the kernel. */
  private _drop(link: ILink, sendClose: boolean): void {
    const session = link.session;
    session.kernelChanged.disconnect(link.onKernelChanged);
    session.statusChanged.disconnect(link.onStatus);
    session.iopubMessage.disconnect(link.onIopub);
    session.disposed.disconnect(link.onDisposed);
    this._closeComm(link, sendClose);
    this._links.delete(session);
    const shown = this._current === link;
    if (shown) {
      this._current = null;
    }
    this.model.forget(link.key);
  }

  private _connect(link: ILink): void {
    this._closeComm(link, true);
    const kernel = this._kernel(link);
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
    const generation = link.generation;
    const inLink = (fn: () => void) => this.model.inKernel(link.key, fn);
    comm.onMsg = msg => {
      if (generation === link.generation) {
        inLink(() => this._onData(link, msg.content.data));
      }
    };
    comm.onClose = () => {
      if (generation !== link.generation) {
        return;
      }
      link.comm = null;
      link.generation += 1;
      inLink(() => {
        this._disarm(link, OPEN_ID);
        this.model.dropPending();
        this.model.setState(
          this.model.state === 'dead' ? 'dead' : 'not-loaded'
        );
      });
    };
    link.comm = comm;
    link.device = null;
    try {
      comm.open({}).done.catch(() => undefined);
    } catch (reason) {
      link.comm = null;
      this.model.setState('not-loaded', String(reason));
      return;
    }
    this._arm(link, OPEN_ID);
  }

  private _onData(link: ILink, data: unknown): void {
    const parsed = parseKernelMessage(data);
    if (!parsed.ok) {
      this.model.setError(parsed.reason);
      return;
    }
    const message = parsed.message;
    const replyTo =
      'reply_to' in message && message.reply_to !== undefined
        ? message.reply_to
        : null;
    if (replyTo !== null && message.type !== 'queued') {
      this._disarm(link, replyTo);
    } else if (message.type === 'queued') {
      this._disarm(link, message.reply_to);
    }
    if (message.type === 'purge_result' && replyTo !== null) {
      const merged = this._batchPart(link, message, replyTo);
      if (merged === null) {
        return;
      }
      this.model.handle(merged);
    } else {
      this.model.handle(message);
    }
    if (message.type === 'hello') {
      this._disarm(link, OPEN_ID);
      if (replyTo === null) {
        this._sendDevice(link);
      }
    } else if (message.type === 'snapshot') {
      this._clearAfterPurge(link);
    } else if (message.type === 'purge_result' && !message.result.dry_run) {
      // the kernel pushes the snapshot after a purge; if none comes, ask for it
      this._clearAfterPurge(link);
      link.afterPurge = setTimeout(() => {
        link.afterPurge = null;
        this._send(link, id => Requests.refresh(id));
      }, PURGE_SNAPSHOT_WAIT_MS);
    }
  }

  /**
   * A purge result that answers one part of a split purge: null until the
   * last part came, then one result for the whole.
   */
  private _batchPart(
    link: ILink,
    message: IPurgeResultMessage,
    replyTo: RequestId
  ): IPurgeResultMessage | null {
    const batch = link.batches.find(b => b.ids.includes(replyTo));
    if (!batch) {
      return message;
    }
    batch.results.push(message.result);
    if (batch.results.length < batch.ids.length) {
      this.model.answered(replyTo);
      return null;
    }
    link.batches = link.batches.filter(b => b !== batch);
    return { ...message, result: mergePurgeResults(batch.results) };
  }

  private _clearAfterPurge(link: ILink): void {
    if (link.afterPurge !== null) {
      clearTimeout(link.afterPurge);
      link.afterPurge = null;
    }
  }

  /** Forget the comm; with `sendClose`, tell the kernel too. */
  private _closeComm(link: ILink, sendClose: boolean): void {
    const comm = link.comm;
    link.comm = null;
    link.generation += 1;
    link.batches = [];
    this._clearAfterPurge(link);
    for (const timer of link.timers.values()) {
      clearTimeout(timer);
    }
    link.timers.clear();
    if (comm && sendClose && !comm.isDisposed) {
      try {
        comm.close().done.catch(() => undefined);
      } catch {
        // The kernel is gone already: nothing to tell.
      }
    }
  }

  private _onKernelChanged(link: ILink): void {
    this._closeComm(link, false);
    link.reconnectOnIdle = false;
    this.model.reset('connecting', this.model.kernelLabel);
    this._connect(link);
  }

  private _onStatusChanged(link: ILink, status: Kernel.Status): void {
    switch (status) {
      case 'restarting':
      case 'autorestarting':
        this._closeComm(link, false);
        link.reconnectOnIdle = true;
        this.model.reset('restarting', this.model.kernelLabel);
        break;
      case 'dead':
        this._closeComm(link, false);
        link.reconnectOnIdle = true;
        this.model.dropPending();
        this.model.setState('dead');
        break;
      case 'busy':
        this._pollServer();
        break;
      case 'idle':
        this.model.cellEnded(Date.now() / 1000);
        if (link.reconnectOnIdle) {
          link.reconnectOnIdle = false;
          this._connect(link);
        } else if (
          link.executedSinceCheck &&
          this.model.state === 'not-loaded'
        ) {
          // A cell ran since the kernel said "not loaded": it may have
          // loaded the extension itself.
          link.executedSinceCheck = false;
          this._connect(link);
        }
        break;
      default:
        break;
    }
  }

  private _onIopub(link: ILink, msg: KernelMessage.IMessage): void {
    if (msg.header.msg_type === 'execute_input') {
      link.executedSinceCheck = true;
      this.model.cellStarted(Date.now() / 1000);
    }
  }

  /**
   * While the kernel shown has no open comm and runs a cell, read the
   * server's figures of it every `SERVER_READINGS_INTERVAL_MS`.
   */
  private _pollServer(): void {
    if (this._serverTimer !== null || !this._readServer) {
      return;
    }
    const tick = async (): Promise<void> => {
      this._serverTimer = null;
      const link = this._current;
      const kernel = link ? this._kernel(link) : null;
      if (!link || !kernel || this._isDisposed) {
        return;
      }
      const state = this.model.state;
      const waiting =
        (state === 'connecting' || state === 'restarting') &&
        kernel.status === 'busy';
      if (!waiting) {
        return;
      }
      try {
        const reading = await this._readServer!(kernel.id);
        if (reading && this._links.get(link.session) === link) {
          this.model.inKernel(link.key, () => {
            const now = this.model.state;
            if (now === 'connecting' || now === 'restarting') {
              this.model.setServerReading(reading);
            }
          });
        }
      } catch {
        // the server extension did not answer: the notice stands alone
      }
      this._serverTimer = setTimeout(
        () => void tick(),
        SERVER_READINGS_INTERVAL_MS
      );
    };
    this._serverTimer = setTimeout(() => void tick(), 0);
  }

  private _links = new Map<ISessionLike, ILink>();
  private _current: ILink | null = null;
  private _keys = 0;
  private _lastId = 0;
  private _isDisposed = false;
  private _readServer: ServerReader | null;
  private _serverTimer: ReturnType<typeof setTimeout> | null = null;
}

/** One result for a purge sent in parts: names and bytes summed. */
export function mergePurgeResults(parts: IPurgeResult[]): IPurgeResult {
  const sum = (key: 'predicted' | 'freed') => {
    const out: { [d: string]: number } = {};
    for (const part of parts) {
      for (const [d, n] of Object.entries(part[key] ?? {})) {
        out[d] = (out[d] ?? 0) + (n ?? 0);
      }
    }
    return out;
  };
  const last = parts[parts.length - 1];
  return {
    ...last,
    names: parts.flatMap(p => p.names),
    removed: parts.flatMap(p => p.removed),
    predicted: sum('predicted'),
    freed: sum('freed'),
    before: parts[0].before,
    after: last.after,
    still_held: last.still_held,
    messages: [...new Set(parts.flatMap(p => p.messages ?? []))]
  };
}
