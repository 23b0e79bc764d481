/**
 * DOM rendering of the sidebar's parts, as plain functions of the data.
 */
import { formatByteMap, formatBytes, sumBytes } from './format';
import {
  IClusterHolder,
  IClusterSnapshot,
  IDeviceUsage,
  IHolder,
  IPurgeResult,
  ISnapshot
} from './protocol';

/** Element factory: `h('div', {class: 'x'}, 'text', child)`. */
export function h(
  tag: string,
  attrs: { [name: string]: string | null } = {},
  ...children: (Node | string | null)[]
): HTMLElement {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value !== null) {
      node.setAttribute(name, value);
    }
  }
  for (const child of children) {
    if (child !== null) {
      node.append(child);
    }
  }
  return node;
}

/** The stacked segments of one device bar, in order. */
export interface IBarSegment {
  key: 'allocated' | 'reserved-free' | 'non-framework' | 'other' | 'free';
  label: string;
  bytes: number;
}

/** Whether a device is host memory without allocator counters (tensors are found by the scan). */
export function isHostTracked(device: IDeviceUsage): boolean {
  return (
    device.kind === 'cpu' &&
    (device.allocated === null || device.allocated === undefined)
  );
}

/**
 * Split a device into the five bar segments of PROTOCOL.md: allocated,
 * reserved but free, non-framework, other processes, free. Missing figures
 * count as zero.
 *
 * Host memory without allocator counters (`cpu`, locally or on a worker)
 * shows the tensors the scan found (`attributed`) in the first segment and the
 * rest of this process in the third, as the live panel does. (`tracked` is
 * kept for callers that ask for it; the host is always drawn that way.)
 */
export function barSegments(
  device: IDeviceUsage,
  tracked = false
): IBarSegment[] {
  if (
    (tracked || isHostTracked(device)) &&
    device.kind === 'cpu' &&
    isHostTracked(device)
  ) {
    const tensors = Math.max(device.attributed ?? 0, 0);
    const process = Math.max(device.used_process ?? 0, 0);
    const other =
      device.other_processes ??
      (device.used_all !== null && device.used_process !== null
        ? device.used_all - device.used_process
        : 0);
    return [
      {
        key: 'allocated',
        label: 'tracked tensors',
        bytes: process ? Math.min(tensors, process) : tensors
      },
      { key: 'reserved-free', label: 'reserved, free', bytes: 0 },
      {
        key: 'non-framework',
        label: 'rest of the process',
        bytes: Math.max(process - tensors, 0)
      },
      { key: 'other', label: 'other processes', bytes: Math.max(other, 0) },
      { key: 'free', label: 'free', bytes: Math.max(device.free ?? 0, 0) }
    ];
  }
  const allocated = device.allocated ?? 0;
  const reserved = device.reserved ?? 0;
  return [
    { key: 'allocated', label: 'allocated', bytes: allocated },
    {
      key: 'reserved-free',
      label: 'reserved, free',
      bytes: Math.max(reserved - allocated, 0)
    },
    {
      key: 'non-framework',
      label: 'non-framework',
      bytes: Math.max(device.non_framework ?? 0, 0)
    },
    {
      key: 'other',
      label: 'other processes',
      bytes: Math.max(device.other_processes ?? 0, 0)
    },
    { key: 'free', label: 'free', bytes: Math.max(device.free ?? 0, 0) }
  ];
}

/**
 * The segments a device's bar draws and the bytes its full width stands for.
 * An accelerator's bar spans the device. A host's bar spans this process
 * (scaled to all host memory its tensors would be under a pixel): the tensors
 * found and the rest of the process; the host's total and free are in words.
 */
export function barScale(device: IDeviceUsage): {
  segments: IBarSegment[];
  whole: number;
} {
  const segments = barSegments(device);
  if (isHostTracked(device)) {
    const drawn = segments.filter(
      s => s.key === 'allocated' || s.key === 'non-framework'
    );
    return {
      segments: drawn,
      whole: drawn.reduce((acc, s) => acc + s.bytes, 0)
    };
  }
  return {
    segments,
    whole: device.total ?? segments.reduce((acc, s) => acc + s.bytes, 0)
  };
}

/** Narrowest a non-empty segment is drawn, in px (so a small one is still seen). */
const MIN_SEGMENT_PX = 3;

/** `tcp://10.0.0.5:40123` -> `10.0.0.5:40123`. */
export function workerLabel(address: string): string {
  const at = address.indexOf('://');
  return at >= 0 ? address.slice(at + 3) : address;
}

/**
 * One device: a title line, a line of figures and its stacked bar. With
 * `worker` (a Dask worker's address) the title reads `worker host:port cuda:N`.
 */
export function renderDevice(
  device: IDeviceUsage,
  worker?: string
): HTMLElement {
  const { segments, whole } = barScale(device);
  const host = isHostTracked(device);
  const bar = h('div', { class: 'jp-GpuMem-bar', role: 'img' });
  const described: string[] = [];
  for (const segment of segments) {
    described.push(`${segment.label} ${formatBytes(segment.bytes)}`);
    if (segment.bytes <= 0 || whole <= 0) {
      continue;
    }
    const share = Math.min((100 * segment.bytes) / whole, 100);
    bar.append(
      h('span', {
        class: `jp-GpuMem-seg jp-GpuMem-seg-${segment.key}`,
        style: `width: ${share.toFixed(2)}%; min-width: ${MIN_SEGMENT_PX}px`,
        title: `${segment.label}: ${formatBytes(segment.bytes)}`
      })
    );
  }
  bar.setAttribute('aria-label', described.join(', '));
  const used = device.used_process ?? device.used_all;
  const figures: string[] = [];
  if (host) {
    figures.push(`tracked tensors ${formatBytes(device.attributed ?? 0)}`);
    if (device.used_process !== null) {
      figures.push(`process ${formatBytes(device.used_process)}`);
    }
  } else {
    figures.push(`allocated ${formatBytes(device.allocated)}`);
    if (used !== null) {
      figures.push(`process ${formatBytes(used)}`);
    }
  }
  const of =
    device.total !== null
      ? host
        ? `host ${formatBytes(device.total)}${device.free !== null ? `, ${formatBytes(device.free)} free` : ''}`
        : `of ${formatBytes(device.total)}`
      : '';
  const label =
    worker !== undefined
      ? `worker ${workerLabel(worker)} ${device.id}`
      : device.id;
  const title = h(
    'div',
    {
      class: 'jp-GpuMem-deviceTitle',
      title: [label, device.name].filter(Boolean).join(' ')
    },
    h('b', {}, label),
    device.name
      ? h('span', { class: 'jp-GpuMem-deviceName' }, ` ${device.name}`)
      : null
  );
  const notes = (device.notes ?? []).map(note =>
    h('div', { class: 'jp-GpuMem-note' }, note)
  );
  return h(
    'div',
    {
      class:
        worker !== undefined
          ? 'jp-GpuMem-device jp-GpuMem-workerDevice'
          : 'jp-GpuMem-device',
      'data-device': device.id,
      'data-worker': worker ?? null
    },
    title,
    h(
      'div',
      { class: 'jp-GpuMem-deviceFigures' },
      figures.join(', ') + (of ? (host ? ` · ${of}` : ` ${of}`) : '')
    ),
    bar,
    ...notes
  );
}

/** `cluster tcp://...:8786 · 2 of 2 workers answered · 3 names hold 80.0 MiB`. */
export function clusterTitle(cluster: IClusterSnapshot): string {
  const missing = Object.keys(cluster.missing ?? {}).length;
  const names = cluster.holders.length;
  return (
    `cluster ${cluster.scheduler ?? '(scheduler did not answer)'} · ` +
    `${cluster.workers.length} of ${cluster.workers.length + missing} workers answered · ` +
    `${names} ${names === 1 ? 'name holds' : 'names hold'} ${formatBytes(cluster.held_bytes ?? 0)}`
  );
}

/**
 * The devices of a Dask cluster's workers, one bar per worker device, under the
 * local ones; a line per worker that did not answer.
 */
export function renderClusterDevices(cluster: IClusterSnapshot): HTMLElement {
  const section = h(
    'div',
    {
      class: 'jp-GpuMem-devices jp-GpuMem-clusterDevices',
      'data-scheduler': cluster.scheduler
    },
    h('div', { class: 'jp-GpuMem-chartTitle' }, clusterTitle(cluster))
  );
  for (const worker of cluster.workers) {
    for (const device of worker.devices) {
      section.append(renderDevice(device, worker.address));
    }
  }
  for (const [address, why] of Object.entries(cluster.missing ?? {})) {
    section.append(
      h(
        'div',
        {
          class: 'jp-GpuMem-note jp-GpuMem-missingWorker',
          'data-worker': address
        },
        `worker ${workerLabel(address)}: ${why}`
      )
    );
  }
  return section;
}

/** Where a cluster holder's bytes are: `worker 10.0.0.5:40123 cuda:1` or `4 workers`. */
export function clusterWhere(holder: IClusterHolder): string {
  const held = Object.entries(holder.workers ?? {}).filter(([, per]) =>
    Object.values(per ?? {}).some(n => n)
  );
  if (held.length === 1) {
    const [address, per] = held[0];
    const devices = Object.keys(per)
      .filter(d => per[d])
      .sort()
      .join(',');
    return `worker ${workerLabel(address)} ${devices}`.trim();
  }
  return held.length ? `${held.length} workers` : 'no worker';
}

/** Keys held by no name that the sidebar lists before "and N more". */
const UNCLAIMED_SHOWN = 5;

/**
 * The notebook names that hold keys on the cluster (not purged from here:
 * `%gpumem purge NAME --cluster` does), and the keys no name holds.
 */
export function renderClusterHolders(cluster: IClusterSnapshot): HTMLElement {
  const section = h(
    'div',
    { class: 'jp-GpuMem-clusterBox' },
    h('div', { class: 'jp-GpuMem-chartTitle' }, 'On the cluster')
  );
  if (cluster.holders.length === 0) {
    section.append(
      h(
        'div',
        { class: 'jp-GpuMem-empty' },
        'No name of this notebook holds a key on the cluster.'
      )
    );
  } else {
    const body = h('tbody');
    for (const holder of cluster.holders) {
      const details = [
        holder.summary,
        holder.aliases?.length ? `also: ${holder.aliases.join(', ')}` : '',
        holder.shared_with?.length
          ? `shared with: ${holder.shared_with.join(', ')}`
          : '',
        holder.largest_path ? `largest: ${holder.largest_path}` : '',
        holder.purge ? `free it: %gpumem purge ${holder.purge} --cluster` : ''
      ].filter(Boolean);
      const absent = Object.entries(holder.not_in_memory ?? {});
      const keys =
        `${holder.in_memory} of ${holder.keys}` +
        (absent.length
          ? ` (${absent.map(([state, n]) => `${n} ${state}`).join(', ')})`
          : '');
      body.append(
        h(
          'tr',
          {
            class: `jp-GpuMem-holder jp-GpuMem-clusterHolder${holder.hidden ? ' jp-GpuMem-hidden' : ''}`,
            'data-name': holder.name,
            title: details.join('\n')
          },
          h('td', { class: 'jp-GpuMem-name' }, holder.name),
          h('td', { class: 'jp-GpuMem-type' }, holder.what),
          h('td', { class: 'jp-GpuMem-bytes' }, formatBytes(holder.total)),
          h('td', { class: 'jp-GpuMem-where' }, clusterWhere(holder)),
          h('td', { class: 'jp-GpuMem-keys' }, keys)
        )
      );
    }
    section.append(
      h(
        'table',
        { class: 'jp-GpuMem-holders jp-GpuMem-clusterHolders' },
        h(
          'thead',
          {},
          h(
            'tr',
            {},
            h('th', {}, 'Name'),
            h('th', {}, 'What'),
            h('th', { title: 'bytes its keys hold on the workers' }, 'Holds'),
            h('th', {}, 'Where'),
            h(
              'th',
              { title: 'keys in worker memory, of those it holds' },
              'Keys'
            )
          )
        ),
        body
      )
    );
  }
  const unclaimed = cluster.unclaimed ?? [];
  const more = cluster.unclaimed_left_off ?? { keys: 0, bytes: 0 };
  if (unclaimed.length > 0) {
    const count = unclaimed.length + (more.keys ?? 0);
    const bytes =
      unclaimed.reduce((acc, u) => acc + (u.bytes || u.sizeof || 0), 0) +
      (more.bytes ?? 0);
    section.append(
      h(
        'div',
        { class: 'jp-GpuMem-unattributed' },
        `In worker memory, held by no name of this notebook: ${count} key${count === 1 ? '' : 's'}, ${formatBytes(bytes)}`
      )
    );
    for (const key of unclaimed.slice(0, UNCLAIMED_SHOWN)) {
      section.append(
        h(
          'div',
          { class: 'jp-GpuMem-note jp-GpuMem-unclaimed', 'data-key': key.key },
          `${key.key} ${formatBytes(key.bytes || key.sizeof)} on worker ${workerLabel(key.worker)}: held by ${
            (key.held_by ?? []).join('; ') || 'no one'
          }`
        )
      );
    }
    if (count > UNCLAIMED_SHOWN) {
      section.append(
        h(
          'div',
          { class: 'jp-GpuMem-note' },
          `… and ${count - UNCLAIMED_SHOWN} more`
        )
      );
    }
  }
  if (cluster.partial) {
    section.append(
      h(
        'div',
        { class: 'jp-GpuMem-note' },
        'Partial answer from the cluster: some keys may be missing.'
      )
    );
  }
  for (const message of cluster.messages ?? []) {
    section.append(h('div', { class: 'jp-GpuMem-note' }, message));
  }
  return section;
}

/** All device bars with one legend per kind of bar (accelerator, host). */
export function renderDevices(
  devices: ReadonlyArray<IDeviceUsage>
): HTMLElement {
  const section = h('div', { class: 'jp-GpuMem-devices' });
  if (devices.length === 0) {
    section.append(
      h('div', { class: 'jp-GpuMem-empty' }, 'No device readings yet.')
    );
    return section;
  }
  for (const device of devices) {
    section.append(renderDevice(device));
  }
  const legend = h('div', { class: 'jp-GpuMem-legend' });
  const seen = new Set<string>();
  for (const device of devices) {
    for (const segment of barScale(device).segments) {
      const key = `${segment.key}|${segment.label}`;
      if (seen.has(key)) {
        continue;
      }
      seen.add(key);
      legend.append(
        h(
          'span',
          { class: 'jp-GpuMem-legendItem' },
          h('span', { class: `jp-GpuMem-swatch jp-GpuMem-seg-${segment.key}` }),
          segment.label
        )
      );
    }
  }
  section.append(legend);
  return section;
}

/** `0.0004` -> `<1 ms`, `0.042` -> `42 ms`, `1.5` -> `1.5 s`. */
export function formatSeconds(seconds: number | null | undefined): string {
  if (
    seconds === null ||
    seconds === undefined ||
    !Number.isFinite(seconds) ||
    seconds < 0
  ) {
    return 'n/a';
  }
  if (seconds < 0.001) {
    return '<1 ms';
  }
  if (seconds < 1) {
    return `${Math.round(seconds * 1000)} ms`;
  }
  return `${seconds.toFixed(seconds < 10 ? 1 : 0)} s`;
}

/** `12:03:05` in the browser's time zone, from epoch seconds. */
export function clockTime(epochSeconds: number): string {
  const d = new Date(epochSeconds * 1000);
  const two = (n: number) => String(n).padStart(2, '0');
  return `${two(d.getHours())}:${two(d.getMinutes())}:${two(d.getSeconds())}`;
}

/**
 * A line of kernel text with its backticked parts as `<code>`: DOM nodes
 * only, the text is never parsed as HTML.
 */
export function renderCodeText(text: string): DocumentFragment {
  const fragment = document.createDocumentFragment();
  const parts = text.split('`');
  // an odd number of backticks leaves the last one as text
  const closed = parts.length % 2 === 1 ? parts.length : parts.length - 1;
  parts.forEach((part, i) => {
    if (i % 2 === 1 && i < closed) {
      fragment.append(h('code', {}, part));
    } else {
      fragment.append((i % 2 === 1 ? '`' : '') + part);
    }
  });
  return fragment;
}

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
