/**
 * The sidebar's JupyterLab settings (schema/sidebar.json): refresh interval
 * and default device, read from the setting registry and applied live.
 */
import type { KernelChannel } from './channel';
import {
  DEFAULT_DEVICE,
  DEFAULT_WARN_SHARE,
  REFRESH_INTERVAL_MS
} from './constants';
import type { GpuMemSidebar } from './sidebar';

/** The sidebar's settings (schema/sidebar.json). */
export interface ISidebarSettings {
  /** Refresh interval of the holders while the kernel is idle, in seconds. */
  refreshInterval: number;
  /** Device selection the sidebar starts with. */
  defaultDevice: string;
  /** Share of a device in use past which the status bar item warns. */
  warnAt: number;
}

/** Read the settings from their composite, with the defaults where a value is off. */
export function readSettings(composite: {
  [key: string]: unknown;
}): ISidebarSettings {
  const interval = composite.refreshInterval;
  const device = composite.defaultDevice;
  const warn = composite.warnAt;
  return {
    refreshInterval:
      typeof interval === 'number' && Number.isFinite(interval) && interval >= 1
        ? interval
        : REFRESH_INTERVAL_MS / 1000,
    defaultDevice:
      typeof device === 'string' && device.trim()
        ? device.trim()
        : DEFAULT_DEVICE,
    warnAt:
      typeof warn === 'number' && Number.isFinite(warn) && warn > 0 && warn <= 1
        ? warn
        : DEFAULT_WARN_SHARE
  };
}

/**
 * Apply settings live: the poll takes the new interval at once; a new
 * default device becomes the selection (and is asked of the kernel).
 */
export function applySettings(
  settings: ISidebarSettings,
  sidebar: GpuMemSidebar,
  channel: KernelChannel,
  statusItem: { warnShare: number } | null = null
): void {
  sidebar.refreshInterval = settings.refreshInterval * 1000;
  if (statusItem) {
    statusItem.warnShare = settings.warnAt;
  }
  if (settings.defaultDevice !== appliedDevice.get(channel)) {
    appliedDevice.set(channel, settings.defaultDevice);
    channel.setDevice(settings.defaultDevice);
  }
}

/** The default device last applied per channel (a change of another setting keeps the user's pick). */
const appliedDevice = new WeakMap<KernelChannel, string>();
