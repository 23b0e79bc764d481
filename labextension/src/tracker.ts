/**
 * Follows the notebook (or console) in focus, as jupyter-resource-usage's
 * tracker does: the main area's current widget when the lab shell is there,
 * the notebook tracker otherwise.
 */
import type { ILabShell } from '@jupyterlab/application';
import type { ISessionContext } from '@jupyterlab/apputils';
import type { INotebookTracker } from '@jupyterlab/notebook';
import { ISignal, Signal } from '@lumino/signaling';
import type { Widget } from '@lumino/widgets';

/** A widget with a kernel session: a notebook panel or a console panel. */
export interface IWidgetWithSession extends Widget {
  sessionContext: ISessionContext;
}

/** Whether a widget carries a session context. */
export function hasSession(
  widget: Widget | null
): widget is IWidgetWithSession {
  const context =
    widget === null
      ? null
      : (widget as unknown as { sessionContext?: unknown }).sessionContext;
  return typeof context === 'object' && context !== null;
}

/**
 * Emits the widget in focus that has a kernel session, or null when focus
 * moves to one that has none.
 */
export class KernelWidgetTracker {
  constructor(options: KernelWidgetTracker.IOptions) {
    const { labShell, notebookTracker } = options;
    if (labShell) {
      labShell.currentChanged.connect((_, change) => {
        this._set(hasSession(change.newValue) ? change.newValue : null);
      });
      const current = labShell.currentWidget;
      this._current = hasSession(current) ? current : null;
    } else {
      notebookTracker.currentChanged.connect((_, panel) => this._set(panel));
    }
    if (!this._current) {
      this._current = notebookTracker.currentWidget ?? null;
    }
  }

  /** Emitted when the widget in focus changes. */
  get currentChanged(): ISignal<this, IWidgetWithSession | null> {
    return this._currentChanged;
  }

  /** The widget in focus with a session, or null. */
  get currentWidget(): IWidgetWithSession | null {
    return this._current;
  }

  private _set(widget: IWidgetWithSession | null): void {
    if (widget === this._current) {
      return;
    }
    this._current = widget;
    this._currentChanged.emit(widget);
  }

  private _current: IWidgetWithSession | null = null;
  private _currentChanged = new Signal<this, IWidgetWithSession | null>(this);
}

export namespace KernelWidgetTracker {
  export interface IOptions {
    labShell: ILabShell | null;
    notebookTracker: INotebookTracker;
  }
}
