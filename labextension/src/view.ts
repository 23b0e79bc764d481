/**
 * DOM rendering of the sidebar's parts, as plain functions of the data.
 */
import { formatByteMap, formatBytes, sumBytes } from './format';
import { ITimelinePoint } from './model';
import {
  IClusterHolder,
  IClusterSnapshot,
  IDeviceUsage,
  IHolder,
  IPurgeResult,
  ISnapshot
} from './protocol';

const SVG_NS = 'http://www.w3.org/2000/svg';

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

/**
 * Split a device into the five bar segments of PROTOCOL.md: allocated,
 * reserved but free, non-framework, other processes, free. Missing figures
 * count as zero.
 *
 * With `tracked`, host memory without allocator counters (a worker's `cpu`)
 * shows the tensors the scan found (`attributed`) in the first segment and the
 * rest of the process in the third, as the live panel does.
 */
export function barSegments(device: IDeviceUsage, tracked = false): IBarSegment[] {
  if (tracked && device.kind === 'cpu' && device.allocated === null) {
    const tensors = Math.max(device.attributed ?? 0, 0);
    const process = Math.max(device.used_process ?? 0, 0);
    return [
      { key: 'allocated', label: 'tracked tensors', bytes: process ? Math.min(tensors, process) : tensors },
      { key: 'reserved-free', label: 'reserved, free', bytes: 0 },
      { key: 'non-framework', label: 'rest of the process', bytes: Math.max(process - tensors, 0) },
      {
        key: 'other',
        label: 'other processes',
        bytes: Math.max(device.other_processes ?? 0, 0)
      },
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

/** `tcp://10.0.0.5:40123` -> `10.0.0.5:40123`. */
export function workerLabel(address: string): string {
  const at = address.indexOf('://');
  return at >= 0 ? address.slice(at + 3) : address;
}

/**
 * One device: a title line and its stacked bar. With `worker` (a Dask worker's
 * address) the title reads `worker host:port cuda:N`.
 */
export function renderDevice(device: IDeviceUsage, worker?: string): HTMLElement {
  const segments = barSegments(device, worker !== undefined);
  const whole =
    device.total ?? segments.reduce((acc, s) => acc + s.bytes, 0);
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
        style: `width: ${share.toFixed(2)}%`,
        title: `${segment.label}: ${formatBytes(segment.bytes)}`
      })
    );
  }
  bar.setAttribute('aria-label', described.join(', '));
  const used = device.used_process ?? device.used_all;
  const hostTracked = worker !== undefined && device.kind === 'cpu' && device.allocated === null;
  const title = h(
    'div',
    { class: 'jp-GpuMem-deviceTitle' },
    h('b', {}, worker !== undefined ? `worker ${workerLabel(worker)} ${device.id}` : device.id),
    device.name ? ` ${device.name}` : '',
    h(
      'span',
      { class: 'jp-GpuMem-deviceFigures' },
      (hostTracked
        ? ` tracked tensors ${formatBytes(device.attributed)}`
        : ` allocated ${formatBytes(device.allocated)}`) +
        (used !== null ? `, process ${formatBytes(used)}` : '') +
        (device.total !== null ? ` of ${formatBytes(device.total)}` : '')
    )
  );
  const notes = (device.notes ?? []).map(note =>
    h('div', { class: 'jp-GpuMem-note' }, note)
  );
  return h(
    'div',
    {
      class: worker !== undefined ? 'jp-GpuMem-device jp-GpuMem-workerDevice' : 'jp-GpuMem-device',
      'data-device': device.id,
      'data-worker': worker ?? null
    },
    title,
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
    { class: 'jp-GpuMem-devices jp-GpuMem-clusterDevices', 'data-scheduler': cluster.scheduler },
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
        { class: 'jp-GpuMem-note jp-GpuMem-missingWorker', 'data-worker': address },
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
      h('div', { class: 'jp-GpuMem-empty' }, 'No name of this notebook holds a key on the cluster.')
    );
  } else {
    const body = h('tbody');
    for (const holder of cluster.holders) {
      const details = [
        holder.summary,
        holder.aliases?.length ? `also: ${holder.aliases.join(', ')}` : '',
        holder.shared_with?.length ? `shared with: ${holder.shared_with.join(', ')}` : '',
        holder.largest_path ? `largest: ${holder.largest_path}` : '',
        holder.purge ? `free it: %gpumem purge ${holder.purge} --cluster` : ''
      ].filter(Boolean);
      const absent = Object.entries(holder.not_in_memory ?? {});
      const keys =
        `${holder.in_memory} of ${holder.keys}` +
        (absent.length ? ` (${absent.map(([state, n]) => `${n} ${state}`).join(', ')})` : '');
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
            h('th', { title: 'keys in worker memory, of those it holds' }, 'Keys')
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
      unclaimed.reduce((acc, u) => acc + (u.bytes || u.sizeof || 0), 0) + (more.bytes ?? 0);
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
      section.append(h('div', { class: 'jp-GpuMem-note' }, `… and ${count - UNCLAIMED_SHOWN} more`));
    }
  }
  if (cluster.partial) {
    section.append(
      h('div', { class: 'jp-GpuMem-note' }, 'Partial answer from the cluster: some keys may be missing.')
    );
  }
  for (const message of cluster.messages ?? []) {
    section.append(h('div', { class: 'jp-GpuMem-note' }, message));
  }
  return section;
}

/** All device bars with one legend. */
export function renderDevices(devices: ReadonlyArray<IDeviceUsage>): HTMLElement {
  const section = h('div', { class: 'jp-GpuMem-devices' });
  if (devices.length === 0) {
    section.append(h('div', { class: 'jp-GpuMem-empty' }, 'No device readings yet.'));
    return section;
  }
  for (const device of devices) {
    section.append(renderDevice(device));
  }
  const legend = h('div', { class: 'jp-GpuMem-legend' });
  for (const segment of barSegments(devices[0])) {
    legend.append(
      h(
        'span',
        { class: 'jp-GpuMem-legendItem' },
        h('span', { class: `jp-GpuMem-swatch jp-GpuMem-seg-${segment.key}` }),
        segment.label
      )
    );
  }
  section.append(legend);
  return section;
}

/**
 * Points of one series as an SVG polyline `points` string: the newest value
 * at the right edge, zero at the bottom, `max` at the top.
 */
export function polylinePoints(
  values: ReadonlyArray<number | null>,
  capacity: number,
  max: number,
  height: number
): string {
  const offset = capacity - values.length;
  const points: string[] = [];
  values.forEach((value, i) => {
    if (value === null) {
      return;
    }
    const y = height - (max > 0 ? (value / max) * height : 0);
    points.push(`${offset + i},${y.toFixed(2)}`);
  });
  return points.join(' ');
}

/** Headroom above the largest value of a chart. */
const CHART_HEADROOM = 1.1;

/**
 * A small chart per device of allocated, reserved and process memory; a
 * series with no value at all (e.g. allocated on the host) is left out.
 */
export function renderTimeline(
  timeline: ReadonlyMap<string, ReadonlyArray<ITimelinePoint>>,
  capacity: number
): HTMLElement {
  const section = h('div', { class: 'jp-GpuMem-timeline' });
  const height = 40;
  for (const [deviceId, points] of timeline) {
    if (points.length === 0) {
      continue;
    }
    const series = (
      [
        ['allocated', points.map(p => p.allocated)],
        ['reserved', points.map(p => p.reserved)],
        ['process', points.map(p => p.used)]
      ] as [string, (number | null)[]][]
    ).filter(([, values]) => values.some(v => v !== null));
    const peak = Math.max(
      1,
      ...series.flatMap(([, values]) => values.map(v => v ?? 0))
    );
    const max = peak * CHART_HEADROOM;
    const svg = document.createElementNS(SVG_NS, 'svg');
    svg.setAttribute('class', 'jp-GpuMem-chart');
    svg.setAttribute('viewBox', `0 0 ${capacity} ${height}`);
    svg.setAttribute('preserveAspectRatio', 'none');
    svg.setAttribute('role', 'img');
    svg.setAttribute(
      'aria-label',
      `${deviceId} over the last ${points.length} readings, up to ${formatBytes(peak)}`
    );
    for (const [name, values] of series) {
      const line = document.createElementNS(SVG_NS, 'polyline');
      line.setAttribute('class', `jp-GpuMem-line jp-GpuMem-line-${name}`);
      line.setAttribute('points', polylinePoints(values, capacity, max, height));
      line.setAttribute('vector-effect', 'non-scaling-stroke');
      svg.appendChild(line);
    }
    const last = points[points.length - 1];
    const figures = series
      .map(([name, values]) => `${name} ${formatBytes(values[values.length - 1])}`)
      .join(', ');
    section.append(
      h(
        'div',
        { class: 'jp-GpuMem-chartBox', 'data-device': deviceId },
        h(
          'div',
          { class: 'jp-GpuMem-chartTitle' },
          `${deviceId}, last ${Math.round(last.time - points[0].time)} s: ${figures}`
        ),
        svg as unknown as Node
      )
    );
  }
  return section;
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
 * The holders table: a checkbox per purgeable holder, the name, what it is,
 * bytes only it keeps, bytes it shares, and its devices.
 */
export function renderHolders(
  snapshot: ISnapshot | null,
  selected: ReadonlySet<string>,
  onToggle: (purgeName: string, checked: boolean) => void
): HTMLElement {
  const section = h('div', { class: 'jp-GpuMem-holdersBox' });
  if (!snapshot) {
    section.append(h('div', { class: 'jp-GpuMem-empty' }, 'No snapshot yet.'));
    return section;
  }
  if (snapshot.holders.length === 0) {
    section.append(
      h(
        'div',
        { class: 'jp-GpuMem-empty' },
        `No name holds memory on "${snapshot.device}".`
      )
    );
  } else {
    const devices = new Set(snapshot.holders.flatMap(h => Object.keys(h.devices)));
    const showDevices = devices.size > 1;
    const body = h('tbody');
    for (const holder of snapshot.holders) {
      for (const row of holderRows(holder, selected, onToggle, showDevices)) {
        body.append(row);
      }
    }
    section.append(
      h(
        'table',
        { class: 'jp-GpuMem-holders' },
        h(
          'thead',
          {},
          h(
            'tr',
            {},
            h('th', {}, ''),
            h('th', {}, 'Name'),
            h('th', {}, 'Type'),
            h('th', { title: 'bytes only this name keeps alive' }, 'Only it'),
            h('th', { title: 'bytes other names reach too' }, 'Shared'),
            showDevices ? h('th', {}, 'Devices') : null
          )
        ),
        body
      )
    );
  }
  const unattributed = snapshot.unattributed
    ? Object.entries(snapshot.unattributed).filter(([, v]) => v)
    : [];
  if (unattributed.length > 0) {
    section.append(
      h(
        'div',
        { class: 'jp-GpuMem-unattributed' },
        `Unattributed (no name reaches it): ${formatByteMap(Object.fromEntries(unattributed))}`
      )
    );
  }
  if (snapshot.partial) {
    section.append(
      h('div', { class: 'jp-GpuMem-note' }, 'Partial scan: some holders may be missing.')
    );
  }
  for (const message of snapshot.messages ?? []) {
    section.append(h('div', { class: 'jp-GpuMem-note' }, message));
  }
  return section;
}

function holderRows(
  holder: IHolder,
  selected: ReadonlySet<string>,
  onToggle: (purgeName: string, checked: boolean) => void,
  showDevices: boolean
): HTMLElement[] {
  const box = h('input', {
    type: 'checkbox',
    class: 'jp-GpuMem-check',
    'aria-label': `select ${holder.label || holder.name}`
  }) as HTMLInputElement;
  if (holder.purge === null) {
    box.disabled = true;
    box.title = 'cannot be purged by name';
  } else {
    const purgeName = holder.purge;
    box.checked = selected.has(purgeName);
    box.addEventListener('change', () => onToggle(purgeName, box.checked));
  }
  const details = [
    holder.largest_path
      ? `largest: ${holder.largest_path} (${formatBytes(holder.largest_bytes)})`
      : '',
    holder.aliases.length ? `also: ${holder.aliases.join(', ')}` : '',
    holder.shared_with.length ? `shared with: ${holder.shared_with.join(', ')}` : '',
    `${holder.tensors} storage${holder.tensors === 1 ? '' : 's'} on ${formatByteMap(holder.devices)}`
  ].filter(Boolean);
  const row = h(
    'tr',
    {
      class: `jp-GpuMem-holder${holder.hidden ? ' jp-GpuMem-hidden' : ''}`,
      'data-name': holder.name,
      title: details.join('\n')
    },
    h('td', {}, box),
    h('td', { class: 'jp-GpuMem-name' }, holder.label || holder.name),
    h('td', { class: 'jp-GpuMem-type' }, holder.type),
    h('td', { class: 'jp-GpuMem-bytes' }, formatBytes(holder.unique)),
    h('td', { class: 'jp-GpuMem-bytes' }, holder.shared ? formatBytes(holder.shared) : ''),
    showDevices
      ? h('td', { class: 'jp-GpuMem-where' }, Object.keys(holder.devices).join(', '))
      : null
  );
  const rows = [row];
  if (holder.hint) {
    rows.push(
      h(
        'tr',
        { class: 'jp-GpuMem-hintRow' },
        h('td', {}, ''),
        h('td', { colspan: showDevices ? '5' : '4', class: 'jp-GpuMem-hint' }, holder.hint)
      )
    );
  }
  return rows;
}

/** One purge result: what was removed, freed, and what still holds memory. */
export function renderPurgeResult(result: IPurgeResult): HTMLElement {
  const freed = sumBytes(result.freed);
  const lines: HTMLElement[] = [
    h(
      'div',
      {},
      result.dry_run
        ? `Dry run: would free ${formatByteMap(result.predicted)}.`
        : `Purged ${result.names.join(', ')}: freed ${
            Object.keys(result.freed).length ? formatByteMap(result.freed) : formatBytes(freed)
          }.`
    )
  ];
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
    lines.push(h('div', { class: 'jp-GpuMem-note' }, message));
  }
  return h('div', { class: 'jp-GpuMem-purgeResult' }, ...lines);
}
