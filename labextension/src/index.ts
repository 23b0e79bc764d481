import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';

import { activateSidebar } from './activate';
import { PLUGIN_ID } from './constants';

/**
 * The "GPU Memory" sidebar: memory of the kernel in focus, one click to purge.
 */
const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'A sidebar that shows which notebook names hold GPU memory in the kernel in focus, and purges them.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ILabShell, ICommandPalette],
  activate: (
    app: JupyterFrontEnd,
    notebookTracker: INotebookTracker,
    labShell: ILabShell | null,
    palette: ICommandPalette | null
  ) => activateSidebar(app, notebookTracker, labShell, palette)
};

export default plugin;
