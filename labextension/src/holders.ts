/**
 * The holders table at any size: a filter, a sort by each figure shown
 * ("Frees": what a purge of it frees, the text report's "only it";
 * "Shared": what other names reach too), a check box that selects every
 * row the filter shows, one line per hint shared by many rows, and only the
 * rows on screen in the DOM (fixed row height, windowing). Its DOM stays: a
 * check changes a box's state in place, so focus stays where it was.
 */
import { h, renderCodeText } from './dom';
import { formatByteMap, formatBytes } from './format';
import { IHolder, ISnapshot } from './protocol';

/** Height of one row, px (fixed: the window is computed from it). */
export const ROW_HEIGHT = 26;

/** Rows drawn above and below the visible ones. */
const OVERSCAN = 8;

/** Height the table's scroll box gets when the page does not say (tests), px. */
const DEFAULT_VIEWPORT = 520;

/** The sort mark a header shows after its label (style/base.css draws it). */
const SORT_MARK = ' ▼';

/** The byte columns: each sized to its widest figure. */
const BYTE_COLUMNS: ReadonlyArray<SortKey> = ['unique', 'shared'];

/** Holders named on a hint line shared by several (the rest are counted), as the text report. */
export const HINT_NAMES = 3;

/** What the rows can be sorted by. */
export type SortKey = 'name' | 'type' | 'unique' | 'shared';

/** `Out[12]` -> ['Out[', 12, ']']: names compare with their numbers as numbers. */
function nameParts(name: string): (string | number)[] {
  return name
    .split(/(\d+)/)
    .filter(p => p !== '')
    .map(p => (/^\d+$/.test(p) ? Number(p) : p));
}

/** Natural order of names: `Out[2]` before `Out[10]`. */
export function compareNames(a: string, b: string): number {
  const pa = nameParts(a);
  const pb = nameParts(b);
  for (let i = 0; i < Math.min(pa.length, pb.length); i++) {
    const x = pa[i];
    const y = pb[i];
    if (x === y) {
      continue;
    }
    if (typeof x === 'number' && typeof y === 'number') {
      return x - y;
    }
    return String(x) < String(y) ? -1 : 1;
  }
  return pa.length - pb.length;
}

/** The label a holder shows. */
export function holderLabel(holder: IHolder): string {
  return holder.label || holder.name;
}

/** The holders that `filter` matches (name, other names, type; any case). */
export function filterHolders(
  holders: ReadonlyArray<IHolder>,
  filter: string
): IHolder[] {
  const needle = filter.trim().toLowerCase();
  if (!needle) {
    return [...holders];
  }
  return holders.filter(
    holder =>
      holderLabel(holder).toLowerCase().includes(needle) ||
      holder.name.toLowerCase().includes(needle) ||
      holder.aliases.some(a => a.toLowerCase().includes(needle)) ||
      holder.type.toLowerCase().includes(needle)
  );
}

/** The holders in the order asked (ties: by name, naturally). */
export function sortHolders(
  holders: ReadonlyArray<IHolder>,
  key: SortKey,
  descending: boolean
): IHolder[] {
  const sign = descending ? -1 : 1;
  const byName = (a: IHolder, b: IHolder) =>
    compareNames(holderLabel(a), holderLabel(b));
  const compare = (a: IHolder, b: IHolder): number => {
    switch (key) {
      case 'name':
        return byName(a, b);
      case 'type':
        return a.type < b.type ? -1 : a.type > b.type ? 1 : 0;
      case 'unique':
        return a.unique - b.unique;
      case 'shared':
        return a.shared - b.shared;
    }
  };
  return [...holders].sort((a, b) => sign * compare(a, b) || byName(a, b));
}

/** Whether a hint names its holder itself (`` `opt` holds ...``): it stands alone. */
function namesItself(holder: IHolder): boolean {
  return !!holder.hint && holder.hint.startsWith(`\`${holder.name}\` `);
}

/**
 * One line per hint, as the text report: a hint that names its holder
 * stands alone; holders that share a hint share its line, the first
 * `HINT_NAMES` named and the rest counted.
 */
export function hintLines(
  holders: ReadonlyArray<IHolder>
): { hint: string; names: string[]; more: number }[] {
  const lines = new Map<string, { hint: string; names: string[] }>();
  for (const holder of holders) {
    if (!holder.hint) {
      continue;
    }
    const alone = namesItself(holder);
    const key = `${alone ? 1 : 0}|${holder.hint}`;
    let line = lines.get(key);
    if (!line) {
      line = { hint: holder.hint, names: [] };
      lines.set(key, line);
    }
    if (!alone) {
      line.names.push(holderLabel(holder));
    }
  }
  return [...lines.values()].map(line => ({
    hint: line.hint,
    names: line.names.sort(compareNames).slice(0, HINT_NAMES),
    more: Math.max(line.names.length - HINT_NAMES, 0)
  }));
}

/** What a byte cell shows: `160.0 MiB`; a dash where it shares nothing. */
function byteFigure(holder: IHolder, key: SortKey): string {
  if (key === 'shared') {
    return holder.shared ? formatBytes(holder.shared) : '–';
  }
  return formatBytes(holder.unique);
}

let measuring: CanvasRenderingContext2D | null | undefined;

/**
 * Width of the widest of `texts` in the font `style` gives, px; null where
 * nothing can measure (no canvas, no font: a detached node).
 */
function textWidth(
  texts: ReadonlyArray<string>,
  style: CSSStyleDeclaration
): number | null {
  if (measuring === undefined) {
    measuring = document.createElement('canvas').getContext('2d');
  }
  if (!measuring || !style.fontSize || !style.fontFamily) {
    return null;
  }
  if (texts.length === 0) {
    return 0;
  }
  measuring.font = `${style.fontStyle} ${style.fontWeight} ${style.fontSize} ${style.fontFamily}`;
  return Math.max(...texts.map(t => measuring!.measureText(t).width));
}

/** Column headers: label, sort key, title. */
const COLUMNS: [string, SortKey, string][] = [
  ['Name', 'name', 'sort by name (Out[N] by N)'],
  ['Type', 'type', 'sort by type'],
  [
    'Frees',
    'unique',
    'what a purge of this name frees: bytes only it keeps alive (the text report\'s "only it")'
  ],
  ['Shared', 'shared', 'bytes it keeps alive that other names reach too']
];

/**
 * The table. `onToggle` gets the purge names of one row or of every row
 * the filter shows.
 */
export class HoldersTable {
  constructor(onToggle: (names: string[], checked: boolean) => void) {
    this._onToggle = onToggle;
    this._filter.setAttribute('type', 'search');
    this._filter.setAttribute('placeholder', 'Filter names (e.g. Out[)');
    this._filter.setAttribute('aria-label', 'Filter the holders');
    this._filter.addEventListener('input', () => {
      this._filterText = this._filter.value;
      this._recompute();
      this._scroll.scrollTop = 0;
      this._drawWindow(true);
    });
    this._all.setAttribute('aria-label', 'select every row shown');
    this._all.title = 'check every purgeable row the filter shows';
    this._all.addEventListener('change', () => {
      const names = this._rows
        .map(h => h.purge)
        .filter((p): p is string => p !== null);
      this._onToggle(names, this._all.checked);
    });
    this._scroll.addEventListener('scroll', () => this._drawWindow(false), {
      passive: true
    });
    const head = h(
      'tr',
      {},
      h('th', { class: 'jp-GpuMem-checkCell' }, this._all)
    );
    for (const [label, key, title] of COLUMNS) {
      const th = h('th', {
        class: `jp-GpuMem-sortable jp-GpuMem-col-${key}`,
        title,
        'data-sort': key,
        scope: 'col'
      });
      const button = h(
        'button',
        { class: 'jp-GpuMem-sortButton', 'aria-label': `Sort by ${label}` },
        label
      );
      button.addEventListener('click', () => this.sortBy(key));
      th.append(button);
      this._headers.set(key, th);
      head.append(th);
    }
    head.append(this._onHeader);
    this._table.append(h('thead', {}, head), this._body);
    this._scroll.append(this._table);
    this.node = h(
      'div',
      { class: 'jp-GpuMem-holdersTable' },
      h('div', { class: 'jp-GpuMem-filterBar' }, this._filter, this._count),
      this._hints,
      this._scroll
    );
    this._markSort();
  }

  readonly node: HTMLElement;

  /** The rows the filter shows, in the order shown. */
  get rows(): ReadonlyArray<IHolder> {
    return this._rows;
  }

  /** The filter's text. */
  get filter(): string {
    return this._filterText;
  }

  set filter(text: string) {
    this._filter.value = text;
    this._filterText = text;
    this._recompute();
    this._drawWindow(true);
  }

  /** The sort key and direction. */
  get sort(): { key: SortKey; descending: boolean } {
    return { key: this._sortKey, descending: this._descending };
  }

  /** Sort by `key`; again by the same key: the other direction. */
  sortBy(key: SortKey, descending?: boolean): void {
    if (descending === undefined) {
      descending =
        key === this._sortKey
          ? !this._descending
          : key === 'unique' || key === 'shared';
    }
    this._sortKey = key;
    this._descending = descending;
    this._markSort();
    this._recompute();
    this._drawWindow(true);
  }

  /** Show these holders (a new snapshot) and this selection. */
  update(snapshot: ISnapshot, selected: ReadonlySet<string>): void {
    this._selected = selected;
    if (snapshot !== this._snapshot) {
      this._snapshot = snapshot;
      const devices = new Set(
        snapshot.holders.flatMap(holder => Object.keys(holder.devices))
      );
      this._showDevices = devices.size > 1;
      this._onHeader.hidden = !this._showDevices;
      this._renderHints();
      this._recompute();
      this._drawWindow(true);
    } else {
      this._syncChecks();
    }
  }

  /** Show no holders (no snapshot: a restart, another device). */
  clear(): void {
    if (this._snapshot === null) {
      return;
    }
    this._snapshot = null;
    this._hints.replaceChildren();
    this._recompute();
    this._drawWindow(true);
  }

  /** Draw the rows again at the current scroll (the box was shown or resized). */
  redraw(): void {
    this._drawWindow(true);
  }

  private _markSort(): void {
    for (const [key, th] of this._headers) {
      th.setAttribute(
        'aria-sort',
        key === this._sortKey
          ? this._descending
            ? 'descending'
            : 'ascending'
          : 'none'
      );
    }
  }

  private _recompute(): void {
    const holders = this._snapshot?.holders ?? [];
    this._rows = sortHolders(
      filterHolders(holders, this._filterText),
      this._sortKey,
      this._descending
    );
    const shown = this._rows.length;
    const all = holders.length;
    this._count.textContent =
      shown === all
        ? `${all} row${all === 1 ? '' : 's'}`
        : `${shown} of ${all} rows`;
    this._body.style.height = '';
  }

  private _renderHints(): void {
    const lines = hintLines(this._snapshot?.holders ?? []);
    this._hints.replaceChildren(
      ...lines.map(line =>
        h(
          'div',
          { class: 'jp-GpuMem-hint' },
          h('span', { class: 'jp-GpuMem-hintLabel' }, 'Hint'),
          ' ',
          line.names.length
            ? h(
                'span',
                { class: 'jp-GpuMem-hintNames' },
                `${line.names.join(', ')}${line.more ? ` and ${line.more} more` : ''}: `
              )
            : null,
          renderCodeText(line.hint)
        )
      )
    );
  }

  /** Draw the rows in view (and `OVERSCAN` around); `force`: even if the same. */
  private _drawWindow(force: boolean): void {
    // the box may be about to grow (it held fewer rows): draw for the window's height
    const viewport = Math.max(
      this._scroll.clientHeight,
      (typeof window !== 'undefined' && window.innerHeight) || 0,
      DEFAULT_VIEWPORT
    );
    const top = this._scroll.scrollTop;
    const first = Math.max(Math.floor(top / ROW_HEIGHT) - OVERSCAN, 0);
    const last = Math.min(
      Math.ceil((top + viewport) / ROW_HEIGHT) + OVERSCAN,
      this._rows.length
    );
    if (!force && first === this._first && last === this._last) {
      return;
    }
    this._first = first;
    this._last = last;
    const columns = this._showDevices ? 6 : 5;
    const rows: HTMLElement[] = [];
    if (first > 0) {
      rows.push(this._spacer(first * ROW_HEIGHT, columns));
    }
    for (let i = first; i < last; i++) {
      rows.push(this._row(this._rows[i]));
    }
    if (last < this._rows.length) {
      rows.push(this._spacer((this._rows.length - last) * ROW_HEIGHT, columns));
    }
    const focused =
      document.activeElement instanceof HTMLElement &&
      this._body.contains(document.activeElement)
        ? document.activeElement.closest('tr')?.getAttribute('data-name')
        : null;
    this._body.replaceChildren(...rows);
    this._sizeByteColumns();
    if (focused) {
      const again = this._body.querySelector<HTMLInputElement>(
        `tr[data-name="${CSS.escape(focused)}"] input`
      );
      again?.focus();
    }
    this._syncAll();
  }

  /**
   * Size each byte column ("Frees", "Shared") to the widest figure it shows
   * (in the cells' font) and to its header (with the sort mark when sorted
   * by it), padding included: a figure is never cut, whatever the sidebar's
   * width; the name column gives the room. Sized again when the holders, the
   * sort or the font (a theme, a font size) change; until the table is in
   * the page, the stylesheet's width.
   */
  private _sizeByteColumns(): void {
    if (!this._table.isConnected) {
      return;
    }
    const cells = getComputedStyle(this._table);
    const font = `${cells.fontStyle} ${cells.fontWeight} ${cells.fontSize} ${cells.fontFamily}`;
    const state = `${font}|${this._sortKey}`;
    if (state === this._sized && this._snapshot === this._sizedFor) {
      return;
    }
    const holders = this._snapshot?.holders ?? [];
    for (const [label, key] of COLUMNS) {
      const th = this._headers.get(key);
      const button = th?.querySelector('button');
      if (!BYTE_COLUMNS.includes(key) || !th || !button) {
        continue;
      }
      const figures = textWidth(
        [...new Set(holders.map(holder => byteFigure(holder, key)))],
        cells
      );
      const header = textWidth(
        [label + (key === this._sortKey ? SORT_MARK : '')],
        getComputedStyle(button)
      );
      if (header === null) {
        return; // nothing measures here: the stylesheet's width stays
      }
      const box = getComputedStyle(th);
      const padding =
        (parseFloat(box.paddingLeft) || 0) +
        (parseFloat(box.paddingRight) || 0);
      // a pixel more than measured: text is laid out at fractional widths
      const width = Math.ceil(Math.max(figures ?? 0, header) + padding) + 1;
      this._table.style.setProperty(`--jp-GpuMem-${key}Width`, `${width}px`);
    }
    this._sized = state;
    this._sizedFor = this._snapshot;
  }

  private _spacer(height: number, columns: number): HTMLElement {
    return h(
      'tr',
      { class: 'jp-GpuMem-spacer', 'aria-hidden': 'true' },
      h('td', { colspan: String(columns), style: `height: ${height}px` })
    );
  }

  private _row(holder: IHolder): HTMLElement {
    const label = holderLabel(holder);
    const box = h('input', {
      type: 'checkbox',
      class: 'jp-GpuMem-check',
      'aria-label': `select ${label}`
    }) as HTMLInputElement;
    if (holder.purge === null) {
      box.disabled = true;
      box.title = 'cannot be purged by name';
    } else {
      const purgeName = holder.purge;
      box.checked = this._selected.has(purgeName);
      box.dataset.purge = purgeName;
      box.addEventListener('change', () =>
        this._onToggle([purgeName], box.checked)
      );
    }
    const details = [
      `${label} (${holder.type})`,
      `frees ${formatBytes(holder.unique)} (only it), shared ${formatBytes(holder.shared)}`,
      holder.largest_path
        ? `largest: ${holder.largest_path} (${formatBytes(holder.largest_bytes)})`
        : '',
      holder.aliases.length ? `also: ${holder.aliases.join(', ')}` : '',
      holder.shared_with.length
        ? `shared with: ${holder.shared_with.join(', ')}`
        : '',
      holder.hint ? `hint: ${holder.hint}` : '',
      `${holder.tensors} storage${holder.tensors === 1 ? '' : 's'} on ${formatByteMap(holder.devices)}`
    ].filter(Boolean);
    return h(
      'tr',
      {
        class: `jp-GpuMem-holder${holder.hidden ? ' jp-GpuMem-hidden' : ''}`,
        'data-name': holder.name,
        title: details.join('\n')
      },
      h('td', { class: 'jp-GpuMem-checkCell' }, box),
      h(
        'td',
        { class: 'jp-GpuMem-nameCell' },
        h('span', { class: 'jp-GpuMem-name' }, label),
        holder.aliases.length
          ? h(
              'span',
              { class: 'jp-GpuMem-sub' },
              ` also ${holder.aliases.join(', ')}`
            )
          : null
      ),
      h('td', { class: 'jp-GpuMem-type' }, holder.type),
      h(
        'td',
        { class: 'jp-GpuMem-bytes jp-GpuMem-frees' },
        byteFigure(holder, 'unique')
      ),
      h(
        'td',
        { class: 'jp-GpuMem-bytes jp-GpuMem-sharedBytes' },
        byteFigure(holder, 'shared')
      ),
      this._showDevices
        ? h(
            'td',
            { class: 'jp-GpuMem-where' },
            Object.keys(holder.devices).join(', ')
          )
        : null
    );
  }

  /** Set the boxes drawn to the selection, in place (focus stays). */
  private _syncChecks(): void {
    for (const box of this._body.querySelectorAll<HTMLInputElement>(
      'input.jp-GpuMem-check'
    )) {
      const name = box.dataset.purge;
      if (name !== undefined) {
        box.checked = this._selected.has(name);
      }
    }
    this._syncAll();
  }

  /** The select-all box: checked when every purgeable row shown is. */
  private _syncAll(): void {
    const purgeable = this._rows.filter(r => r.purge !== null);
    const checked = purgeable.filter(r => this._selected.has(r.purge!)).length;
    this._all.disabled = purgeable.length === 0;
    this._all.checked = purgeable.length > 0 && checked === purgeable.length;
    this._all.indeterminate = checked > 0 && checked < purgeable.length;
  }

  private _onToggle: (names: string[], checked: boolean) => void;
  private _snapshot: ISnapshot | null = null;
  private _selected: ReadonlySet<string> = new Set();
  private _rows: IHolder[] = [];
  private _filterText = '';
  private _sortKey: SortKey = 'unique';
  private _descending = true;
  private _showDevices = false;
  /** The font and sort, and the snapshot, the byte columns were sized for. */
  private _sized = '';
  private _sizedFor: ISnapshot | null = null;
  private _first = -1;
  private _last = -1;
  private _headers = new Map<SortKey, HTMLElement>();
  private _onHeader = h('th', { scope: 'col' }, 'On');
  private _filter = h('input', {
    class: 'jp-GpuMem-filter'
  }) as HTMLInputElement;
  private _count = h('span', { class: 'jp-GpuMem-filterCount' });
  private _all = h('input', {
    type: 'checkbox',
    class: 'jp-GpuMem-checkAll'
  }) as HTMLInputElement;
  private _hints = h('div', { class: 'jp-GpuMem-hints' });
  private _table = h('table', { class: 'jp-GpuMem-holders' });
  private _body = h('tbody');
  private _scroll = h('div', { class: 'jp-GpuMem-tableScroll' });
}
