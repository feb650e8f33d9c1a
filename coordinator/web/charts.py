"""The console's charts, drawn as SVG by matplotlib from the checker's recent ``system/metrics`` rows.

Each chart covers ``[since, now]``: messages delivered per second and per topic (summed over
buckets of ``bucket_s``), commit→visible latency per topic (each batch's median and 99th
percentile, as the checker recorded them), and each batch's duration.

Example::

    rows = read_metrics(lakehouse, CHART_COLUMNS, since=since)
    svg = throughput_chart(rows, since, now, bucket_s=10)
"""

from __future__ import annotations

import datetime as dt
import io
from collections import defaultdict
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["CHART_COLUMNS", "batches_chart", "latency_chart", "throughput_chart"]

#: The ``system/metrics`` columns the charts read.
CHART_COLUMNS = ["batch_id", "finished_at", "duration_ms", "delivered_by_topic", "visible_p50_ms_by_topic", "visible_p99_ms_by_topic"]


def throughput_chart(rows: pa.Table, since: dt.datetime, now: dt.datetime, bucket_s: int) -> bytes:
    """Messages delivered per second, per topic, in buckets of ``bucket_s`` seconds."""
    buckets = int((now - since).total_seconds() // bucket_s) + 1
    per_topic: dict[str, list[float]] = defaultdict(lambda: [0.0] * buckets)
    for row in rows.to_pylist():
        bucket = int((row["finished_at"] - since).total_seconds() // bucket_s)
        for topic, delivered in row["delivered_by_topic"] or ():
            if 0 <= bucket < buckets:
                per_topic[topic][bucket] += delivered / bucket_s
    times = [since + dt.timedelta(seconds=bucket_s * (i + 0.5)) for i in range(buckets)]
    figure, axes = _figure("Delivered per topic", "messages / s", since, now)
    for topic, rates in sorted(per_topic.items()):
        axes.plot(times, rates, label=topic, drawstyle="steps-mid")
    return _svg(figure, axes, bool(per_topic))


def latency_chart(rows: pa.Table, since: dt.datetime, now: dt.datetime) -> bytes:
    """Commit→visible latency per topic: each delivering batch's median (solid) and p99 (dashed)."""
    series: dict[str, list[tuple[dt.datetime, float, float]]] = defaultdict(list)
    for row in rows.to_pylist():
        p99 = dict(row["visible_p99_ms_by_topic"] or ())
        for topic, p50 in row["visible_p50_ms_by_topic"] or ():
            series[topic].append((row["finished_at"], p50 / 1000, p99[topic] / 1000))
    figure, axes = _figure("Commit → visible per topic (median, p99 dashed)", "seconds", since, now)
    for topic, points in sorted(series.items()):
        times, p50s, p99s = zip(*points)
        line, = axes.plot(times, p50s, label=f"{topic} p50", marker=".", markersize=3)
        axes.plot(times, p99s, label=f"{topic} p99", linestyle="--", color=line.get_color())
    return _svg(figure, axes, bool(series))


def batches_chart(rows: pa.Table, since: dt.datetime, now: dt.datetime) -> bytes:
    """Each batch's duration, from the trigger to its committed writes."""
    rows = rows.select(["finished_at", "duration_ms"]).to_pylist()
    figure, axes = _figure("Checker batches", "duration (s)", since, now)
    axes.plot([r["finished_at"] for r in rows], [r["duration_ms"] / 1000 for r in rows], marker=".", markersize=3,
              linestyle="none", label="batch")
    return _svg(figure, axes, bool(rows))


def _figure(title: str, unit: str, since: dt.datetime, now: dt.datetime):
    # matplotlib is imported when a chart is drawn, not with the console: `txcoord console-user` needs none of it.
    from matplotlib.dates import DateFormatter
    from matplotlib.figure import Figure

    figure = Figure(figsize=(4.4, 2.6), dpi=100, layout="constrained")
    axes = figure.add_subplot()
    axes.set_title(title, fontsize=10, loc="left")
    axes.set_ylabel(unit, fontsize=9)
    axes.set_xlim(since, now)
    axes.xaxis.set_major_formatter(DateFormatter("%H:%M:%S", tz=dt.timezone.utc))
    axes.tick_params(labelsize=8)
    axes.grid(alpha=0.3)
    return figure, axes


def _svg(figure: Figure, axes, has_data: bool) -> bytes:
    from matplotlib import rc_context

    if has_data:
        axes.set_ylim(bottom=0)
        axes.legend(fontsize=7, loc="upper left")
    else:
        axes.text(0.5, 0.5, "no batch in this window", transform=axes.transAxes, ha="center", color="gray")
    out = io.BytesIO()
    # Text as text, not outlines: smaller (docs/performance-log.md#figures-quoted-elsewhere-before), and readable by
    # screen readers and searches.
    with rc_context({"svg.fonttype": "none"}):
        figure.savefig(out, format="svg")
    return out.getvalue()
