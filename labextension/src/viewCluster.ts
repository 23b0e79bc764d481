/**
 * A Dask cluster seen from the notebook: its workers' device bars, and the
 * names of this notebook that hold keys on it.
 */
import { h } from './dom';
import { formatBytes } from './format';
import { IClusterHolder, IClusterSnapshot } from './protocol';
import { renderDevice, workerLabel } from './viewDevices';

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
