/**
 * Ids, names and defaults of the sidebar: the one place they live.
 */

/** Id of the JupyterLab plugin. */
export const PLUGIN_ID = 'jupyter-gpumem:sidebar';

/** Id of the sidebar widget (also its DOM id). */
export const SIDEBAR_ID = 'jupyter-gpumem-sidebar';

/**
 * Caption of the sidebar's tab and name of its command: the kernel's memory,
 * GPU or host (no "GPU" where there may be none).
 */
export const SIDEBAR_TITLE = 'Kernel Memory';

/** Rank of the sidebar in the right area. */
export const SIDEBAR_RANK = 900;

/** Comm target registered by the kernel side (`jupyter_gpumem/comm.py`). */
export const COMM_TARGET = 'jupyter_gpumem';

/** The only code the sidebar ever runs in a kernel, after an explicit click. */
export const LOAD_EXTENSION_CODE = '%load_ext jupyter_gpumem';

/** Schema tags of the JSON the kernel sends (docs/PROTOCOL.md). */
export const SNAPSHOT_SCHEMA = 'jupyter_gpumem.snapshot/1';
export const PURGE_SCHEMA = 'jupyter_gpumem.purge/1';
/** Schema of a snapshot's optional `cluster` part (a Dask cluster's workers). */
export const CLUSTER_SCHEMA = 'jupyter_gpumem.cluster/1';
/** Schema of the server extension's `GET api/gpumem/kernels` answer. */
export const KERNELS_SCHEMA = 'jupyter_gpumem.kernels/1';

/** Device selection when the sidebar starts. */
export const DEFAULT_DEVICE = 'auto';

/** Device selections always offered; `cuda:N` ones are added as seen. */
export const DEVICE_CHOICES: ReadonlyArray<string> = ['auto', 'all', 'cpu'];

/**
 * Number of device readings kept for the timeline (about one a second): the
 * last 10 minutes, as many as the kernel's `hello` may bring.
 */
export const TIMELINE_POINTS = 600;

/** A request with no answer after this long shows "no answer from the kernel", in ms. */
export const ANSWER_TIMEOUT_MS = 10000;

/**
 * Most names one purge request holds for a kernel that does not say it takes
 * more (a `hello` without `busy`: an older kernel side).
 */
export const OLD_PURGE_NAMES_MAX = 256;

/** How often the server's per-kernel readings are asked while a kernel's comm is not open yet, in ms. */
export const SERVER_READINGS_INTERVAL_MS = 1500;

/** Share of a device past which the status bar item shows its warning colour. */
export const DEFAULT_WARN_SHARE = 0.9;

/**
 * How often the holders table is refreshed while the kernel is idle, in ms.
 * The kernel also pushes a snapshot after each cell.
 */
export const REFRESH_INTERVAL_MS = 15000;

/**
 * How long the sidebar waits for the snapshot the kernel pushes after a
 * purge before it asks for one, in ms.
 */
export const PURGE_SNAPSHOT_WAIT_MS = 1500;

/** Most names listed in the purge confirmation before "and N more". */
export const CONFIRM_LIST_MAX = 12;

/** Name of the sidebar's tab icon. */
export const ICON_NAME = 'jupyter-gpumem:chip';

/** Command that opens the sidebar. */
export const OPEN_COMMAND = 'jupyter-gpumem:open';

/** Id of the status bar item. */
export const STATUS_ID = 'jupyter-gpumem:status';
