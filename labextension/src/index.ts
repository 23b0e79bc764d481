import {
  ILabShell,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { INotebookTracker } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

// the sidebar is added to the shell when the plugin activates: nothing to load later
// eslint-disable-next-line jupyter/prefer-lazy-imports
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
  // optional: Jupyter Notebook 7 has no lab shell (its right panel holds the sidebar)
  optional: [ILabShell, ICommandPalette, ISettingRegistry],
  activate: (
    app: JupyterFrontEnd,
    notebookTracker: INotebookTracker,
    labShell: ILabShell | null,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null
  ) => activateSidebar(app, notebookTracker, labShell, palette, settingRegistry)
};

export default plugin;
