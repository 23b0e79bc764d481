/**
 * Wiring of the plugin: model, channel, sidebar, the Kernels section's
 * backend and focus tracking.
 */
import type { ILabShell, JupyterFrontEnd } from '@jupyterlab/application';
import type { ICommandPalette } from '@jupyterlab/apputils';
import type { INotebookTracker } from '@jupyterlab/notebook';
import type { ISettingRegistry } from '@jupyterlab/settingregistry';
import type { Kernel } from '@jupyterlab/services';
import type { IStatusBar } from '@jupyterlab/statusbar';
import { Poll } from '@lumino/polling';

import { KernelChannel } from './channel';
import {
  OPEN_COMMAND,
  PLUGIN_ID,
  SIDEBAR_ID,
  SIDEBAR_RANK,
  SIDEBAR_TITLE,
  STATUS_ID
} from './constants';
import { confirmAction, confirmPurge } from './dialog';
import { gpuMemIcon } from './icon';
import { purgeHiddenThroughComm } from './kernelComm';
import { IKernelsBackend, KernelsSection, serverReader } from './kernels';
import { SidebarModel } from './model';
import { serverRequest } from './request';
import { applySettings, readSettings } from './settings';
import { GpuMemSidebar } from './sidebar';
import { MemoryStatusItem } from './statusbar';
import { hasSession, IWidgetWithSession, KernelWidgetTracker } from './tracker';

/** How often the Kernels section asks the server while the sidebar shows, in ms. */
const KERNELS_INTERVAL_MS = 5000;

/**
 * The connection a notebook or console of the main area holds to the kernel
 * `id` and that handles its comms, or null.
 */
function openConnection(
  app: JupyterFrontEnd,
  id: string
): Kernel.IKernelConnection | null {
  for (const widget of app.shell.widgets('main')) {
    const kernel = hasSession(widget)
      ? widget.sessionContext.session?.kernel
      : null;
    if (kernel && kernel.id === id && kernel.handleComms) {
      return kernel;
    }
  }
  return null;
}

/**
 * The Kernels section's backend for this JupyterLab: the server's endpoints
 * (request.ts), the document manager, the kernel API, a kernel's own comm
 * (kernelComm.ts) and a confirmation dialog.
 */
export function labKernelsBackend(app: JupyterFrontEnd): IKernelsBackend {
  const services = app.serviceManager;
  return {
    request: serverRequest(services.serverSettings),
    async open(path: string): Promise<void> {
      await app.commands.execute('docmanager:open', { path });
    },
    async shutdown(kernelId: string): Promise<void> {
      await services.kernels.shutdown(kernelId);
    },
    purgeHidden: (id, name) =>
      purgeHiddenThroughComm(
        services.kernels,
        id,
        name,
        confirmAction,
        openConnection(app, id)
      ),
    confirm: confirmAction
  };
}

/** Add the sidebar to the right area and make it follow the kernel in focus. */
export function activateSidebar(
  app: JupyterFrontEnd,
  notebookTracker: INotebookTracker,
  labShell: ILabShell | null,
  palette: ICommandPalette | null,
  settingRegistry: ISettingRegistry | null = null,
  statusBar: IStatusBar | null = null
): void {
  const model = new SidebarModel();
  const backend = labKernelsBackend(app);
  const channel = new KernelChannel(model, serverReader(backend));
  const sidebar = new GpuMemSidebar({ model, channel, confirmPurge });
  sidebar.id = SIDEBAR_ID;
  sidebar.title.icon = gpuMemIcon;
  sidebar.title.caption = SIDEBAR_TITLE;
  app.shell.add(sidebar, 'right', { rank: SIDEBAR_RANK });

  // the Kernels section: every kernel of the server and the orphans (server extension)
  const kernels = new KernelsSection(backend);
  sidebar.node.append(kernels.node);
  const kernelsPoll = new Poll({
    factory: () => (sidebar.isVisible ? kernels.refresh() : Promise.resolve()),
    frequency: { interval: KERNELS_INTERVAL_MS, backoff: false },
    standby: 'when-hidden',
    name: 'jupyter-gpumem:kernels'
  });
  sidebar.disposed.connect(() => kernelsPoll.dispose());

  const tracker = new KernelWidgetTracker({ labShell, notebookTracker });
  const follow = (widget: IWidgetWithSession | null): void => {
    channel.follow(
      widget ? widget.sessionContext : null,
      widget ? widget.title.label : ''
    );
  };
  tracker.currentChanged.connect((_, widget) => follow(widget));
  follow(tracker.currentWidget);

  app.commands.addCommand(OPEN_COMMAND, {
    label: `Show ${SIDEBAR_TITLE}`,
    describedBy: { args: { type: 'object', properties: {} } },
    execute: () => app.shell.activateById(SIDEBAR_ID)
  });
  palette?.addItem({ command: OPEN_COMMAND, category: 'Kernel' });

  // the status bar item, as jupyter-resource-usage's: a click opens the sidebar
  const statusItem = new MemoryStatusItem(model, () =>
    app.shell.activateById(SIDEBAR_ID)
  );
  statusBar?.registerStatusItem(STATUS_ID, {
    item: statusItem,
    align: 'left',
    rank: 3
  });

  if (settingRegistry) {
    settingRegistry
      .load(PLUGIN_ID)
      .then(settings => {
        const apply = (): void =>
          applySettings(
            readSettings(settings.composite),
            sidebar,
            channel,
            statusItem
          );
        settings.changed.connect(apply);
        apply();
      })
      .catch(reason => {
        console.warn(
          `${PLUGIN_ID}: settings not read, defaults stand:`,
          reason
        );
      });
  }
}
