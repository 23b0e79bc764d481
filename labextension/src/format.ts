/**
 * Formatting at the edge: bytes are integers everywhere else.
 */

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];

/** `4194304` -> `"4.0 MiB"`; `null` -> `"n/a"`. */
export function formatBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || !Number.isFinite(bytes)) {
    return 'n/a';
  }
  const sign = bytes < 0 ? '-' : '';
  let value = Math.abs(bytes);
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return unit === 0
    ? `${sign}${value} B`
    : `${sign}${value.toFixed(1)} ${UNITS[unit]}`;
}

/** Sum of the values of a byte map, ignoring nulls. */
export function sumBytes(map: { [key: string]: number | null } | null): number {
  if (!map) {
    return 0;
  }
  return Object.values(map).reduce<number>((acc, v) => acc + (v ?? 0), 0);
}

/** `{"cpu": 4194304}` -> `"cpu 4.0 MiB"`, devices in key order. */
export function formatByteMap(
  map: { [key: string]: number | null } | null
): string {
  if (!map) {
    return '';
  }
  return Object.entries(map)
    .map(([device, bytes]) => `${device} ${formatBytes(bytes)}`)
    .join(', ');
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
