#!/usr/bin/env python3
"""A picture of the Grafana dashboard, drawn from what a real Prometheus
answered (`make dashboard-picture`).

    dashboard_picture.py DATA PNG

DATA is what the end-to-end test `dashboard::every_panel_of_the_dashboard_
shows_data_after_mixed_traffic` writes with LLM_FILTER_DASHBOARD_DATA set:
examples/grafana/llm-filter.json with each target's range-query result
(`series`, Prometheus's `matrix`) and the run's `range`. Each panel is drawn
where its gridPos puts it, in Grafana's dark theme: time series as lines,
stats as their last value, the bucket heatmap as counts per bucket over
time, the status history as a row per series coloured by its value.
"""

import json
import math
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import colors  # noqa: E402

BG, PANEL, TEXT, GRID, DIM = "#111217", "#181b1f", "#ccccdc", "#2c3235", "#8e8e8e"
PALETTE = ["#73bf69", "#f2cc0c", "#5794f2", "#ff9830", "#f2495c", "#b877d9",
           "#8ab8ff", "#ffcb7d", "#96d98d", "#ca95e5", "#fade2a", "#ff7383"]
WIDTH_IN = 20.0
UNIT_W = WIDTH_IN / 24
UNIT_H = UNIT_W * 0.375  # Grafana: a grid row is 30 px, a column ~80 px


def legend(fmt, metric):
    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: metric.get(m.group(1), ""), fmt or "")
    return text.strip() or ",".join(f"{k}={v}" for k, v in metric.items()) or "value"


def number(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


def scaled(unit, v):
    return v * 100 if unit == "percentunit" else v


def shown(unit, v):
    if math.isnan(v):
        return "no data"
    suffix = {"percentunit": "%", "ms": " ms", "µs": " µs", "reqps": " req/s", "ops": " ops/s"}.get(unit, "")
    v = scaled(unit, v)
    if abs(v) >= 1e6:
        return f"{v / 1e6:.1f} M{suffix}"
    if abs(v) >= 1e3:
        return f"{v / 1e3:.1f} k{suffix}"
    return f"{v:.2f}{suffix}" if abs(v) < 10 else f"{v:.0f}{suffix}"


def series_of(panel):
    """(label, times, values) of every series of every target."""
    out = []
    for t in panel.get("targets", []):
        for s in t.get("series", []):
            times = [float(p[0]) for p in s.get("values", [])]
            values = [number(p[1]) for p in s.get("values", [])]
            out.append((legend(t.get("legendFormat"), s.get("metric", {})), times, values))
    return out


def style(ax):
    ax.set_facecolor(PANEL)
    for side in ax.spines.values():
        side.set_color(GRID)
    ax.tick_params(colors=DIM, labelsize=6)
    ax.grid(color=GRID, linewidth=0.5)


def minutes(times, start):
    return [(t - start) / 60 for t in times]


def timeseries(ax, panel, start, unit):
    style(ax)
    for i, (label, times, values) in enumerate(series_of(panel)[:12]):
        ax.plot(minutes(times, start), [scaled(unit, v) for v in values],
                color=PALETTE[i % len(PALETTE)], linewidth=1.0, label=label[:40])
    if ax.lines:
        ax.legend(fontsize=5, loc="upper left", frameon=False, labelcolor=TEXT, ncol=2)
    ax.set_xlabel("minutes", fontsize=6, color=DIM)


def stat(ax, panel, unit):
    ax.set_facecolor(PANEL)
    ax.axis("off")
    series = series_of(panel)
    last = next((v for _, _, vs in series for v in reversed(vs) if not math.isnan(v)), math.nan)
    ax.text(0.5, 0.5, shown(unit, last), ha="center", va="center", fontsize=22,
            color=PALETTE[0], transform=ax.transAxes)


def heatmap(ax, panel, start):
    """Prometheus buckets (cumulative by `le`) as counts per bucket."""
    style(ax)
    buckets = {}
    for label, times, values in series_of(panel):
        le = math.inf if label == "+Inf" else number(label)
        if not math.isnan(le):
            buckets[le] = (times, values)
    if not buckets:
        return
    les = sorted(buckets)
    times = buckets[les[0]][0]
    rows, below = [], [0.0] * len(times)
    for le in les:
        values = [0.0 if math.isnan(v) else v for v in buckets[le][1]][:len(times)]
        values += [0.0] * (len(times) - len(values))
        rows.append([max(v - b, 0.0) for v, b in zip(values, below)])
        below = values
    # Only the buckets that ever held a call, so the picture shows the spread.
    kept = [i for i, r in enumerate(rows) if any(r)] or list(range(len(rows)))
    lo, hi = max(kept[0] - 1, 0), min(kept[-1] + 2, len(rows))
    grid = rows[lo:hi]
    ax.pcolormesh(minutes(times, start), range(len(grid)), grid, cmap="inferno", shading="nearest")
    ax.set_yticks(range(len(grid)))
    ax.set_yticklabels(["+Inf" if math.isinf(le) else f"{le:g}" for le in les[lo:hi]], fontsize=5)
    ax.set_xlabel("minutes", fontsize=6, color=DIM)


def status_history(ax, panel, start, unit):
    style(ax)
    series = series_of(panel)
    if not series:
        return
    times = series[0][1]
    grid = []
    for _, ts, values in series:
        by_time = dict(zip(ts, values))
        grid.append([by_time.get(t, math.nan) for t in times])
    finite = [v for r in grid for v in r if not math.isnan(v)]
    norm = colors.Normalize(min(finite, default=0), max(finite, default=1))
    ax.pcolormesh(minutes(times, start), range(len(grid)), grid, cmap="RdYlGn_r", norm=norm,
                  shading="nearest")
    ax.set_yticks(range(len(grid)))
    ax.set_yticklabels([label[:20] for label, _, _ in series], fontsize=6)
    ax.grid(False)
    ax.set_xlabel(f"minutes; colour: {shown(unit, norm.vmin)} (green) to {shown(unit, norm.vmax)} (red)",
                  fontsize=6, color=DIM)


def draw(data, out):
    panels = data["panels"]
    start = data["range"]["start"]
    total_h = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels)
    fig = plt.figure(figsize=(WIDTH_IN, total_h * UNIT_H + 0.6), facecolor=BG)
    top = total_h * UNIT_H + 0.6
    fig.text(0.01, 1 - 0.3 / top, f"{data['title']} — {data.get('description', '')}",
             color=TEXT, fontsize=11, va="center")

    def box(g, pad_top=0.0):
        x0 = g["x"] * UNIT_W / WIDTH_IN
        w = g["w"] * UNIT_W / WIDTH_IN
        y1 = 1 - (0.6 + g["y"] * UNIT_H) / top
        h = g["h"] * UNIT_H / top
        return x0, y1 - h, w, h - pad_top

    for p in panels:
        g = p["gridPos"]
        x, y, w, h = box(g)
        if p["type"] == "row":
            fig.text(x + 0.005, y + h / 2, p["title"], color=TEXT, fontsize=10, weight="bold", va="center")
            continue
        unit = p.get("fieldConfig", {}).get("defaults", {}).get("unit", "short")
        # Title above, margins for the ticks inside the panel's box.
        mx, my = 0.022, 0.016
        ax = fig.add_axes([x + mx, y + my * 1.6, w - mx * 1.4, h - my * 3.4])
        fig.text(x + 0.004, y + h - my * 0.9, p["title"], color=TEXT, fontsize=7, va="center")
        kind = p["type"]
        if kind == "stat":
            stat(ax, p, unit)
        elif kind == "heatmap":
            heatmap(ax, p, start)
        elif kind == "status-history":
            status_history(ax, p, start, unit)
        else:
            timeseries(ax, p, start, unit)
    fig.savefig(out, dpi=72, facecolor=BG)


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[1]) as f:
        draw(json.load(f), argv[2])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
