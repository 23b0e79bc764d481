/**
 * The timelines: one small uPlot chart per device, with a byte axis from
 * zero, time ticks, the values under the cursor in its legend, and a band
 * for each cell that ran.
 */
import uPlot from 'uplot';

import { h } from './dom';
import { clockTime, formatBytes } from './format';
import { ICellBand, ITimelinePoint } from './kernelView';

/** One line of a chart. */
export interface ISeriesSpec {
  key: 'allocated' | 'reserved' | 'process' | 'tracked';
  label: string;
  color: string;
  dash?: number[];
}

/** The lines a chart can draw, in order; those without any value are left out. */
export const SERIES: ReadonlyArray<ISeriesSpec> = [
  { key: 'allocated', label: 'allocated', color: '#d84315' },
  { key: 'reserved', label: 'reserved', color: '#ff8a65', dash: [4, 3] },
  { key: 'process', label: 'process', color: '#7e57c2' },
  { key: 'tracked', label: 'tracked tensors', color: '#d84315' }
];

/** Seconds between two readings beyond which the line is broken (the device was not shown). */
export const GAP_SECONDS = 5;

/** Height of one chart's plot and axes, in px. */
export const CHART_HEIGHT = 96;

/** Shortest time a chart spans, in seconds (a few readings are not stretched over it). */
export const MIN_SPAN_SECONDS = 30;

/** The time range a chart shows: its readings, or the last `MIN_SPAN_SECONDS` up to the newest. */
export function timeRange(
  min: number | null,
  max: number | null
): [number, number] {
  if (
    min === null ||
    max === null ||
    !Number.isFinite(min) ||
    !Number.isFinite(max)
  ) {
    const now = Date.now() / 1000;
    return [now - MIN_SPAN_SECONDS, now];
  }
  return max - min < MIN_SPAN_SECONDS
    ? [max - MIN_SPAN_SECONDS, max]
    : [min, max];
}

/** Narrowest a cell band is drawn, in px. */
export const MIN_BAND_PX = 4;

/** What one chart draws: time in epoch seconds, and one value list per series. */
export interface ITimelineData {
  specs: ISeriesSpec[];
  data: (number | null)[][];
}

function valueOf(
  point: ITimelinePoint,
  key: ISeriesSpec['key']
): number | null {
  switch (key) {
    case 'allocated':
      return point.allocated;
    case 'reserved':
      return point.reserved;
    case 'process':
      return point.used;
    case 'tracked':
      return point.tracked ?? null;
  }
}

/**
 * The aligned data of one device's chart: the readings' times, a null
 * reading in each gap longer than `GAP_SECONDS` (so the line breaks there
 * instead of bridging the time the device was not shown), and the series
 * that have a value at all.
 */
export function timelineData(
  points: ReadonlyArray<ITimelinePoint>
): ITimelineData {
  const specs = SERIES.filter(spec =>
    points.some(p => valueOf(p, spec.key) !== null)
  );
  const times: number[] = [];
  const columns: (number | null)[][] = specs.map(() => []);
  let previous: number | null = null;
  for (const point of points) {
    if (previous !== null && point.time - previous > GAP_SECONDS) {
      times.push((point.time + previous) / 2);
      columns.forEach(column => column.push(null));
    }
    times.push(point.time);
    specs.forEach((spec, i) => columns[i].push(valueOf(point, spec.key)));
    previous = point.time;
  }
  return { specs, data: [times, ...columns] };
}

/** The cells that overlap `[from, to]`, clipped to it; a running cell ends at `to`. */
export function visibleBands(
  cells: ReadonlyArray<ICellBand>,
  from: number,
  to: number
): [number, number][] {
  const out: [number, number][] = [];
  for (const cell of cells) {
    const end = cell.end ?? to;
    if (end < from || cell.start > to) {
      continue;
    }
    out.push([Math.max(cell.start, from), Math.min(end, to)]);
  }
  return out;
}

/** Steps of the byte axis: 1, 2, 5, 10, 20, 50, 100, 200, 500 of each unit. */
export const BYTE_STEPS: number[] = [
  1,
  1024,
  1024 ** 2,
  1024 ** 3,
  1024 ** 4
].flatMap(unit => [1, 2, 5, 10, 20, 50, 100, 200, 500].map(k => k * unit));

/**
 * Round byte ticks from 0 that cover `max` in about `count` steps (1, 2 or 5
 * times a power of ten of one binary unit): the splits, and the top of the
 * axis (the last split). The panel's `byte_ticks` follows the same rule.
 */
export function byteTicks(
  max: number,
  count = 3
): { splits: number[]; top: number } {
  const top = Math.max(Number.isFinite(max) ? max : 1, 1);
  const units = [1024 ** 4, 1024 ** 3, 1024 ** 2, 1024, 1];
  const unit = units.find(u => top >= u) ?? 1;
  const raw = top / unit / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  let step = [1, 2, 5, 10].map(m => m * mag).find(s => s >= raw) ?? 10 * mag;
  if (unit === 1) {
    step = Math.max(Math.round(step), 1);
  }
  const n = Math.ceil(top / unit / step - 1e-9);
  const splits = Array.from({ length: n + 1 }, (_, i) =>
    Math.round(i * step * unit)
  );
  return { splits, top: splits[splits.length - 1] };
}

/** Steps of the time axis, in seconds. */
export const TIME_STEPS = [
  1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600
];

/** Least room a time label takes, in px (`13:02:30` in the axis font, and a gap). */
export const TIME_LABEL_PX = 48;

/**
 * Time ticks at round seconds (multiples of 5 s, 10 s, 30 s, 1 min...) inside
 * `[min, max]`: the smallest step that leaves each label `TIME_LABEL_PX` of a
 * chart `width` px wide, so there are several, never one near the end.
 */
export function timeTicks(min: number, max: number, width: number): number[] {
  const span = Math.max(max - min, 1);
  const room = Math.max(Math.floor(width / TIME_LABEL_PX), 3);
  const step =
    TIME_STEPS.find(s => span / s <= room) ?? TIME_STEPS[TIME_STEPS.length - 1];
  const out: number[] = [];
  for (let t = Math.ceil(min / step) * step; t <= max + 1e-6; t += step) {
    out.push(t);
  }
  return out;
}

/** `4294967296` -> `4 GiB`: short labels for the byte axis. */
export function axisBytes(bytes: number): string {
  if (bytes === 0) {
    return '0';
  }
  const text = formatBytes(bytes);
  return text.replace(/\.0 /, ' ');
}

function cssVar(name: string, fallback: string): string {
  const value =
    typeof getComputedStyle === 'function'
      ? getComputedStyle(document.body).getPropertyValue(name).trim()
      : '';
  return value || fallback;
}

/**
 * One device's chart. Its uPlot is made once and then given new data; where
 * no canvas can be drawn (a test DOM) the chart is left out and its title and
 * figures still show.
 */
export class DeviceChart {
  constructor(deviceId: string) {
    this.deviceId = deviceId;
    this.node = h('div', {
      class: 'jp-GpuMem-chartBox',
      'data-device': deviceId
    });
    this.node.append(this._title, this._plotBox);
  }

  readonly deviceId: string;
  readonly node: HTMLElement;

  /** The uPlot, once made (null where there is no canvas). */
  get plot(): uPlot | null {
    return this._plot;
  }

  /** Draw these readings and cells at this width (px). */
  update(
    points: ReadonlyArray<ITimelinePoint>,
    cells: ReadonlyArray<ICellBand>,
    width: number
  ): void {
    const { specs, data } = timelineData(points);
    this._cells = cells;
    const last = points[points.length - 1];
    const span = points.length ? Math.round(last.time - points[0].time) : 0;
    this._title.replaceChildren(
      h('b', {}, this.deviceId),
      h(
        'span',
        { class: 'jp-GpuMem-chartSpan' },
        ` · ${span < 120 ? `last ${span} s` : `last ${Math.round(span / 60)} min`}`
      )
    );
    this.node.dataset.points = String(points.length);
    this.node.dataset.cells = String(cells.length);
    this.node.setAttribute(
      'aria-label',
      `${this.deviceId}: ` +
        specs
          .map(
            (spec, i) =>
              `${spec.label} ${formatBytes(data[i + 1][data[i + 1].length - 1])}`
          )
          .join(', ')
    );
    // the axis colours are the theme's: a theme change draws the chart anew
    const key =
      specs.map(s => s.key).join('|') +
      `|${cssVar('--jp-ui-font-color1', '')}|${cssVar('--jp-border-color2', '')}`;
    if (width <= 0 || specs.length === 0) {
      return;
    }
    if (this._plot && (key !== this._key || this._failed)) {
      this._plot.destroy();
      this._plot = null;
    }
    this._key = key;
    const aligned = data as unknown as uPlot.AlignedData;
    if (!this._plot) {
      this._plot = this._make(specs, aligned, width);
      return;
    }
    if (Math.abs(this._plot.width - width) >= 1) {
      this._plot.setSize({ width, height: CHART_HEIGHT });
    }
    this._plot.setData(aligned);
    this._showLatest();
  }

  dispose(): void {
    this._plot?.destroy();
    this._plot = null;
    this.node.remove();
  }

  private _make(
    specs: ISeriesSpec[],
    data: uPlot.AlignedData,
    width: number
  ): uPlot | null {
    // the axis labels in the theme's main text colour (readable on its background)
    const text = cssVar('--jp-ui-font-color1', '#212121');
    const grid = cssVar('--jp-border-color2', '#e0e0e0');
    const family = cssVar('--jp-ui-font-family', 'sans-serif');
    const font = `10px ${family}`;
    const options: uPlot.Options = {
      width,
      height: CHART_HEIGHT,
      padding: [6, 22, 0, 0],
      cursor: {
        drag: { x: false, y: false, setScale: false },
        points: { size: 5 }
      },
      legend: { show: true, live: true },
      scales: {
        x: { time: true, range: (_u, min, max) => timeRange(min, max) },
        y: { range: (_u, _min, max) => [0, byteTicks(max).top] }
      },
      series: [
        {
          label: 'time',
          value: (_u, v) => (v === null || v === undefined ? '–' : clockTime(v))
        },
        ...specs.map(spec => ({
          label: spec.label,
          stroke: spec.color,
          width: 1.5,
          dash: spec.dash,
          points: { show: false },
          spanGaps: false,
          value: (_u: uPlot, v: number | null) =>
            v === null || v === undefined ? '–' : formatBytes(v)
        }))
      ],
      axes: [
        {
          stroke: text,
          font,
          size: 22,
          space: TIME_LABEL_PX,
          splits: (u, _axis, min, max) =>
            this._ticked(
              'xticks',
              timeTicks(min, max, u.bbox.width / (window.devicePixelRatio || 1))
            ),
          grid: { stroke: grid, width: 1 },
          ticks: { stroke: grid, width: 1, size: 3 },
          values: (_u, splits) => splits.map(v => clockTime(v))
        },
        {
          stroke: text,
          font,
          size: 54,
          space: 22,
          incrs: BYTE_STEPS,
          splits: (_u, _axis, _min, max) =>
            this._ticked('yticks', byteTicks(max).splits),
          grid: { stroke: grid, width: 1 },
          ticks: { stroke: grid, width: 1, size: 3 },
          values: (_u, splits) => splits.map(axisBytes)
        }
      ],
      hooks: {
        drawClear: [u => this._drawBands(u)],
        setCursor: [
          u => {
            if (u.cursor.idx === null || u.cursor.idx === undefined) {
              this._showLatest();
            }
          }
        ]
      }
    };
    try {
      const plot = new uPlot(options, data, this._plotBox);
      this._failed = false;
      this._plot = plot;
      this._showLatest();
      return plot;
    } catch {
      // no 2D canvas here (a test DOM): the title and figures stand alone
      this._plotBox.replaceChildren();
      this._failed = true;
      return null;
    }
  }

  /** The ticks an axis draws, kept on the chart's node (`data-xticks`: how many). */
  private _ticked(key: 'xticks' | 'yticks', splits: number[]): number[] {
    this.node.dataset[key] = String(splits.length);
    return splits;
  }

  /** With no cursor on the chart, the legend shows the newest reading. */
  private _showLatest(): void {
    const plot = this._plot;
    if (!plot) {
      return;
    }
    const n = plot.data[0]?.length ?? 0;
    if (n > 0 && (plot.cursor.idx === null || plot.cursor.idx === undefined)) {
      plot.setLegend({ idx: n - 1 }, false);
    }
  }

  /** Cell bands under the lines: a tinted span and a stronger left edge. */
  private _drawBands(u: uPlot): void {
    const xs = u.data[0];
    if (!xs || xs.length === 0) {
      return;
    }
    const min = u.scales.x.min ?? xs[0];
    const max = u.scales.x.max ?? xs[xs.length - 1];
    const ctx = u.ctx;
    const { top, height, left, width } = u.bbox;
    const ratio = typeof devicePixelRatio === 'number' ? devicePixelRatio : 1;
    ctx.save();
    for (const [start, end] of visibleBands(this._cells, min, max)) {
      const x0 = Math.max(u.valToPos(start, 'x', true), left);
      const x1 = Math.min(
        Math.max(u.valToPos(end, 'x', true), x0 + MIN_BAND_PX * ratio),
        left + width
      );
      ctx.fillStyle = 'rgba(25, 118, 210, 0.2)';
      ctx.fillRect(x0, top, x1 - x0, height);
      ctx.fillStyle = 'rgba(25, 118, 210, 0.7)';
      ctx.fillRect(x0, top, Math.max(ratio, 1), height);
    }
    ctx.restore();
  }

  private _title = h('div', { class: 'jp-GpuMem-chartTitle' });
  private _plotBox = h('div', { class: 'jp-GpuMem-plot' });
  private _plot: uPlot | null = null;
  private _key = '';
  private _failed = false;
  private _cells: ReadonlyArray<ICellBand> = [];
}

/** The charts of the devices shown, kept across renders (one uPlot each). */
export class TimelineView {
  readonly node = h('div', { class: 'jp-GpuMem-timeline' });

  /** The chart of each device drawn now. */
  get charts(): ReadonlyMap<string, DeviceChart> {
    return this._charts;
  }

  /**
   * Draw the timelines of `deviceIds` (the devices the sidebar shows now)
   * from the readings kept per device, at `width` px.
   */
  update(
    timeline: ReadonlyMap<string, ReadonlyArray<ITimelinePoint>>,
    deviceIds: ReadonlyArray<string>,
    cells: ReadonlyArray<ICellBand>,
    width: number
  ): void {
    const shown = deviceIds.filter(id => (timeline.get(id) ?? []).length > 0);
    for (const [id, chart] of this._charts) {
      if (!shown.includes(id)) {
        chart.dispose();
        this._charts.delete(id);
      }
    }
    shown.forEach(id => {
      let chart = this._charts.get(id);
      if (!chart) {
        chart = new DeviceChart(id);
        this._charts.set(id, chart);
      }
      this.node.append(chart.node); // keeps the order of deviceIds
      chart.update(timeline.get(id) ?? [], cells, width);
    });
    if (shown.length > 0 && !this._legendNote.isConnected) {
      this.node.append(this._legendNote);
    } else if (shown.length === 0) {
      this._legendNote.remove();
    } else {
      this.node.append(this._legendNote);
    }
  }

  dispose(): void {
    for (const chart of this._charts.values()) {
      chart.dispose();
    }
    this._charts.clear();
  }

  private _charts = new Map<string, DeviceChart>();
  private _legendNote = h(
    'div',
    { class: 'jp-GpuMem-chartNote' },
    h('span', { class: 'jp-GpuMem-bandSwatch' }),
    'a cell running · hover for values'
  );
}
