import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStatusBar } from '@jupyterlab/statusbar';

// the sidebar is added to the shell when the plugin activates: nothing to load later
// eslint-disable-next-line jupyter/prefer-lazy-imports
import { activateSidebar } from './activate';
import { PLUGIN_ID } from './constants';

/**
 * The "Kernel Memory" sidebar: memory of the kernel in focus (GPU, or host
 * where there is none), one click to purge; a status bar item.
 */
const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'A sidebar that shows which notebook names hold GPU (or host) memory in the kernel in focus, and purges them; a status bar item with its memory.',
  autoStart: true,
  requires: [INotebookTracker],
  // optional: Jupyter Notebook 7 has no lab shell (its right panel holds the sidebar)
  optional: [ILabShell, ICommandPalette, ISettingRegistry, IStatusBar],
  activate: (
    app: JupyterFrontEnd,
    notebookTracker: INotebookTracker,
    labShell: ILabShell | null,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    statusBar: IStatusBar | null
  ) =>
    activateSidebar(
      app,
      notebookTracker,
      labShell,
      palette,
      settingRegistry,
      statusBar
    )
};

export default plugin;
