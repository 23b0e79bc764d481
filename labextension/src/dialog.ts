/**
 * The confirmations, JupyterLab dialogs: the sidebar's purge, and the
 * Kernels section's actions (shut down, purge hidden holders, end orphans).
 */
import { Dialog, showDialog } from '@jupyterlab/apputils';
import { Widget } from '@lumino/widgets';

import { CONFIRM_LIST_MAX } from './constants';
import { formatBytes } from './format';
import { h } from './dom';

/** Ask before deleting names from the kernel; true to go ahead. */
export async function confirmPurge(
  names: string[],
  predictedBytes: number,
  notebook: string
): Promise<boolean> {
  const shown = names.slice(0, CONFIRM_LIST_MAX);
  const list = h(
    'ul',
    { class: 'jp-GpuMem-confirmList' },
    ...shown.map(n => h('li', {}, n))
  );
  if (names.length > shown.length) {
    list.append(h('li', {}, `and ${names.length - shown.length} more`));
  }
  const body = h(
    'div',
    { class: 'jp-GpuMem-confirm' },
    h(
      'p',
      {},
      `Delete ${names.length === 1 ? 'this name' : `these ${names.length} names`} from the kernel` +
        `${notebook ? ` of ${notebook}` : ''}, ` +
        'with the hidden references to the same objects (output history, last traceback), ' +
        `and release the framework caches. Expected to free about ${formatBytes(predictedBytes)}.`
    ),
    list
  );
  const result = await showDialog({
    title: notebook ? `Purge from ${notebook}?` : 'Purge from the kernel?',
    body: new Widget({ node: body }),
    buttons: [
      Dialog.cancelButton(),
      Dialog.warnButton({
        label: `Purge ${names.length} name${names.length === 1 ? '' : 's'}`
      })
    ],
    // Enter keeps what the user has: the destructive button needs a click
    defaultButton: 0
  });
  return result.button.accept;
}

/** Ask before an action that changes something; true to go ahead. */
export async function confirmAction(
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
