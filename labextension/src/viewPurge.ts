/**
 * One purge result: what was removed and freed, and what still holds memory.
 */
import { h, renderCodeText } from './dom';
import { formatByteMap, formatBytes, sumBytes } from './format';
import { IPurgeResult } from './protocol';

/**
 * One purge result: what was removed, freed, and what still holds memory;
 * `onDismiss` adds a close button.
 */
export function renderPurgeResult(
  result: IPurgeResult,
  onDismiss?: () => void
): HTMLElement {
  const freed = sumBytes(result.freed);
  const headline = h(
    'div',
    { class: 'jp-GpuMem-purgeHeadline' },
    h(
      'span',
      {},
      result.dry_run
        ? `Dry run: would free ${formatByteMap(result.predicted)}.`
        : `Purged ${result.names.join(', ')}: freed ${
            Object.keys(result.freed).length
              ? formatByteMap(result.freed)
              : formatBytes(freed)
          }.`
    )
  );
  if (onDismiss) {
    const close = h(
      'button',
      {
        class: 'jp-GpuMem-dismiss',
        title: 'Dismiss',
        'aria-label': 'Dismiss the purge result'
      },
      '×'
    );
    close.addEventListener('click', () => onDismiss());
    headline.append(close);
  }
  const lines: HTMLElement[] = [headline];
  if (result.removed.length) {
    lines.push(h('div', {}, `Removed: ${result.removed.join(', ')}`));
  }
  for (const held of result.still_held ?? []) {
    lines.push(
      h(
        'div',
        { class: 'jp-GpuMem-warn' },
        `Still held by ${held.by}${held.path ? ` (${held.path})` : ''}: ${formatBytes(held.bytes)}`
      )
    );
  }
  for (const message of result.messages ?? []) {
    lines.push(h('div', { class: 'jp-GpuMem-note' }, renderCodeText(message)));
  }
  return h('div', { class: 'jp-GpuMem-purgeResult' }, ...lines);
}
