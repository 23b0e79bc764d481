/**
 * The device bars: one stacked bar per device (allocated, reserved but free,
 * non-framework, other processes, free) and their legend.
 */
import { h } from './dom';
import { formatBytes } from './format';
import { IDeviceUsage } from './protocol';

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
