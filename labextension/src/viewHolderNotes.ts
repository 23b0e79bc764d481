/**
 * What goes under the holders table: what a purge of the checked rows frees,
 * the bytes no name reaches, the kernel's notes, and when the scan ran.
 */
import { h } from './dom';
import { clockTime, formatByteMap, formatSeconds } from './format';
import { IHolder, ISnapshot } from './protocol';

/** Total of the bytes only these holders keep alive. */
export function predictedBytes(
  holders: ReadonlyArray<IHolder>,
  selected: ReadonlySet<string>
): number {
  return holders
    .filter(h => h.purge !== null && selected.has(h.purge))
    .reduce((acc, holder) => acc + holder.unique, 0);
}

/**
 * What goes under the holders table: the bytes no name reaches, a partial
 * scan, the kernel's notes, and when the scan ran.
 */
export function renderHolderNotes(
  snapshot: ISnapshot,
  hideMessage: (message: string) => boolean = () => false
): HTMLElement[] {
  const out: HTMLElement[] = [];
  if (snapshot.holders.length === 0) {
    out.push(
      h(
        'div',
        { class: 'jp-GpuMem-empty' },
        `No name holds memory on "${snapshot.device}".`
      )
    );
  }
  const unattributed = snapshot.unattributed
    ? Object.entries(snapshot.unattributed).filter(([, v]) => v)
    : [];
  if (unattributed.length > 0) {
    out.push(
      h(
        'div',
        { class: 'jp-GpuMem-unattributed' },
        `Unattributed (no name reaches it): ${formatByteMap(Object.fromEntries(unattributed))}`
      )
    );
  }
  if (snapshot.partial) {
    out.push(
      h(
        'div',
        { class: 'jp-GpuMem-note' },
        'Partial scan: some holders may be missing.'
      )
    );
  }
  for (const message of snapshot.messages ?? []) {
    if (!hideMessage(message)) {
      out.push(h('div', { class: 'jp-GpuMem-note' }, message));
    }
  }
  const count = snapshot.holders.length;
  out.push(
    h(
      'div',
      { class: 'jp-GpuMem-scanned' },
      `${count} holder${count === 1 ? '' : 's'} · scanned at ${clockTime(snapshot.time)} in ${formatSeconds(
        snapshot.scan_seconds
      )}`
    )
  );
  return out;
}
