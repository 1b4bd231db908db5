"""The report's charts as static SVG drawn by matplotlib (no script, text kept as text, so small).

Time axes are seconds from the start of the capture, so the panels of one
capture's connections line up. Imports matplotlib on first use only.
"""

from __future__ import annotations

import io
import re
from functools import cache
from statistics import quantiles

from .model import ConnectionReport, Throughput
from .signals import Distribution, Signals

WIDTH_IN = 9.0
#: Time bins drawn per connection at most.
CHART_BINS = 150
PANEL_IN = 1.35
MARKER_COLOURS = {
    "checkpoint": "#2a9d4a",
    "restart": "#b5179e",
    "error": "#d62828",
    "abort": "#e76f51",
    "end": "#555",
    "rollback": "#7b2cbf",
    "connect": "#0077b6",
}
DIRECTION_COLOURS = ("#1f77b4", "#ff7f0e")


@cache
def available() -> bool:
    """Is matplotlib installed (the ``report`` extra)? Without it the report has no charts, and says so."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


@cache
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    matplotlib.rcParams.update(
        {
            "svg.fonttype": "none",  # text as <text>, not glyph paths: a fraction of the size
            "svg.hashsalt": "wallaroo-proto",  # the same ids every run
            "font.size": 8,
            "axes.titlesize": 9,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "path.simplify": True,
        }
    )
    from matplotlib import pyplot

    return pyplot


def _svg(fig) -> str:
    buffer = io.StringIO()
    # Fixed margins rather than bbox_inches="tight": one drawing pass instead of two.
    fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None})
    _pyplot().close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]  # inline: no XML prolog or DOCTYPE
    return re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.S)  # RDF boilerplate


def _steps(throughput: Throughput, t0: float, column: int) -> tuple[list[float], list[float]]:
    """Rates per bin (per second), zero where a bin is empty, as a step line."""
    if not throughput.bins:
        return [], []
    last = max(throughput.bins)
    xs, ys = [], []
    for index in range(last + 2):
        cell = throughput.bins.get(index)
        xs.append(throughput.start - t0 + index * throughput.width)
        ys.append((cell[column] if cell else 0) / throughput.width)
    return xs, ys


def connection_chart(conn: ConnectionReport, t0: float) -> str | None:
    """Frames/s and bytes/s per direction, then the protocol's series; spans shaded, markers as lines."""
    if conn.throughput is None or not available():
        return None
    plt = _pyplot()
    signals = conn.signal_values() or Signals()
    panels = 2 + len(signals.series)
    height = PANEL_IN * panels + 0.6
    fig, axes = plt.subplots(panels, 1, sharex=True, figsize=(WIDTH_IN, height))
    fig.subplots_adjust(left=0.085, right=0.99, top=1 - 0.25 / height, bottom=0.45 / height, hspace=0.3)
    throughput = Throughput.from_dict(conn.throughput).coarsened(CHART_BINS)
    arrows = (
        f"{_role(conn.lanes[0])} → {_role(conn.lanes[1])}",
        f"{_role(conn.lanes[1])} → {_role(conn.lanes[0])}",
    )
    bin_note = f"{_duration(throughput.width)} bins"
    for ax, offset, unit in ((axes[0], 0, "frames/s"), (axes[1], 1, "bytes/s")):
        for direction in (0, 1):
            xs, ys = _steps(throughput, t0, offset + 2 * direction)
            ax.step(xs, ys, where="post", label=arrows[direction], color=DIRECTION_COLOURS[direction], lw=1)
        ax.set_ylabel(unit)
    axes[0].set_title(f"per direction, {bin_note}", loc="left")
    _legend_above(axes[0])
    for ax, series in zip(axes[2:], signals.series, strict=False):
        xs = [t - t0 for t, _ in series.points]
        ys = [v for _, v in series.points]
        if series.step and xs:
            xs.append(conn.last_ts - t0)
            ys.append(ys[-1])
            ax.step(xs, ys, where="post", color="#333", lw=1)
        else:
            ax.plot(xs, ys, marker=".", color="#333", lw=1)
        ax.set_ylabel(series.unit or series.name)
        ax.set_title(series.name + (" (thinned)" if series.thinned else ""), loc="left")
        ax.set_ylim(bottom=0)
    for ax in axes:
        for span in signals.spans:
            ax.axvspan(
                span.start - t0, max(span.end, span.start + 1e-6) - t0, color="#d62828", alpha=0.15, lw=0
            )
        for marker in signals.markers:
            ax.axvline(marker.ts - t0, color=MARKER_COLOURS.get(marker.kind, "#555"), lw=0.8, ls="--")
    _marker_legend(axes[-1], signals)
    axes[-1].set_xlabel("seconds from the capture's start")
    return _svg(fig)


def _marker_legend(ax, signals: Signals) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = []
    for kind in dict.fromkeys(m.kind for m in signals.markers):
        handles.append(Line2D([], [], color=MARKER_COLOURS.get(kind, "#555"), ls="--", lw=0.8, label=kind))
    if signals.spans:
        handles.append(Patch(color="#d62828", alpha=0.15, label=signals.span_label or "spans"))
    if handles:
        _legend_above(ax, handles)


def _legend_above(ax, handles=None) -> None:
    """A legend on the panel's title line, right-aligned: outside the plot, so it covers no data."""
    kwargs = {} if handles is None else {"handles": handles}
    count = len(handles) if handles is not None else len(ax.get_legend_handles_labels()[0])
    ax.legend(**kwargs, loc="lower right", bbox_to_anchor=(1, 1), borderaxespad=0.1, fontsize=7,
              frameon=False, ncol=max(count, 1))  # fmt: skip


def _role(lane: str) -> str:
    return lane.split(" ")[0] if " " in lane else lane


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:g} ms" if seconds < 1 else f"{seconds:g} s"


def stats(dist: Distribution) -> dict[str, float | None]:
    """p50 and p99 from the sample (exact when nothing was sampled out), with exact count, min, max, mean."""
    sample = sorted(dist.sample)
    if len(sample) >= 2:
        cuts = quantiles(sample, n=100, method="inclusive")
        p50, p99 = cuts[49], cuts[98]
    else:
        p50 = p99 = sample[0] if sample else None
    mean = dist.total / dist.count if dist.count else None
    return {"count": dist.count, "min": dist.low, "p50": p50, "p99": p99, "max": dist.high, "mean": mean}


def distribution_chart(title: str, dists: list[Distribution]) -> str:
    """One histogram (milliseconds) per distribution, side by side."""
    plt = _pyplot()
    # The page's width whatever the count, so every chart on the page is drawn at one scale.
    fig, axes = plt.subplots(1, len(dists), figsize=(WIDTH_IN, 2.6), squeeze=False)
    fig.subplots_adjust(left=0.085, right=0.99, top=0.8, bottom=0.2, wspace=0.25)
    for ax, dist in zip(axes[0], dists, strict=True):
        values = [v * 1000 for v in dist.sample]
        ax.hist(values, bins=min(40, max(5, len(values) // 4)), color="#1f77b4")
        ax.set_xlabel("milliseconds")
        ax.ticklabel_format(axis="x", useOffset=False)
        ax.set_ylabel("count" + (" (sample)" if dist.sampled else ""))
        ax.set_title(dist.name, loc="left")
    fig.suptitle(title, x=0.01, ha="left", fontsize=9)
    return _svg(fig)
