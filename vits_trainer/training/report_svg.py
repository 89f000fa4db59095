"""The inline SVG pictures of report.html (report.py): line charts of values over steps and the budget's
timeline of a session. Plain strings, no charting library: the page opens from disk with nothing else.

Every text that reaches the SVG goes through html.escape; a value that is None or not finite is left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from html import escape

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"]
PHASE_COLORS = {
    "load": "#b0b0b0",  # loading the model and data, preload
    "eval": "#ff7f0e",
    "trial": "#9467bd",  # the micro-batch trial
    "train": "#1f77b4",
    "end": "#2ca02c",  # final evaluation, last checkpoint, export, summary
}


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]  # (x, y); None / non-finite y already dropped by `series`
    markers: bool = False
    dashed: bool = False


# A chart wider than ~700 px cannot show more points than this; a long run's thousands of metric lines
# are averaged in runs of consecutive points down to it (the page stays small and quick to rewrite).
MAX_POINTS = 600


def series(label: str, xs: list, ys: list, markers: bool = False, dashed: bool = False) -> Series:
    """A Series of the finite (x, y) pairs only, averaged down to at most MAX_POINTS."""
    points = [
        (float(x), float(y))
        for x, y in zip(xs, ys, strict=True)
        if is_finite_number(x) and is_finite_number(y)
    ]
    return Series(label, thin(points), markers, dashed)


def thin(points: list[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """`points` as at most `limit` means of consecutive runs (the first and last point kept as they are)."""
    if len(points) <= limit:
        return points
    size = math.ceil(len(points) / limit)
    means = [
        (sum(x for x, _ in run) / len(run), sum(y for _, y in run) / len(run))
        for run in (points[i : i + size] for i in range(0, len(points), size))
    ]
    return [points[0], *means[1:-1], points[-1]]


def is_finite_number(value) -> bool:
    """A finite int or float (not a bool, None or a string): a value a chart can draw."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def nice_ticks(low: float, high: float, count: int = 5, min_step: float = 0.0) -> list[float]:
    """About `count` round tick values covering [low, high], at least `min_step` apart."""
    # one value, or values a rounding error apart (a constant learning rate averaged down by `thin`):
    # a band of +-10 % around it. A step below the values' float resolution never advanced the loop.
    if high - low <= 1e-9 * max(abs(low), abs(high)):
        low, high = low - (0.1 * abs(low) or 1.0), high + (0.1 * abs(high) or 1.0)
    raw = (high - low) / max(1, count)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = max(min_step, next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw))
    first = math.ceil(low / step)
    last = math.floor(high / step + 1e-9)
    return [round(k * step, 10) for k in range(first, last + 1)]


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"


@dataclass
class Frame:
    """The plot area of a chart and its data ranges: maps data to pixels."""

    width: int
    height: int
    x_range: tuple[float, float]
    y_range: tuple[float, float]
    left: int = 60
    right: int = 12
    top: int = 26
    bottom: int = 34

    def x(self, value: float) -> float:
        low, high = self.x_range
        return self.left + (value - low) / ((high - low) or 1.0) * (self.width - self.left - self.right)

    def y(self, value: float) -> float:
        low, high = self.y_range
        span = self.height - self.top - self.bottom
        return self.top + span - (value - low) / ((high - low) or 1.0) * span


def _axes(frame: Frame, x_label: str, y_label: str, y_axis: bool = True, x_step: float = 0.0) -> list[str]:
    parts = []
    x_ticks = nice_ticks(*frame.x_range, min_step=x_step)
    y_ticks = nice_ticks(*frame.y_range) if y_axis else [*frame.y_range]
    frame.x_range = (min(frame.x_range[0], x_ticks[0]), max(frame.x_range[1], x_ticks[-1]))
    frame.y_range = (min(frame.y_range[0], y_ticks[0]), max(frame.y_range[1], y_ticks[-1]))
    bottom = frame.height - frame.bottom
    for t in y_ticks if y_axis else []:
        y = frame.y(t)
        parts.append(
            f'<line class="grid" x1="{frame.left}" x2="{frame.width - frame.right}" y1="{y:.1f}" y2="{y:.1f}"/>'
        )
        parts.append(
            f'<text class="tick" x="{frame.left - 4}" y="{y + 3:.1f}" text-anchor="end">{_label(t)}</text>'
        )
    for t in x_ticks:
        x = frame.x(t)
        parts.append(f'<line class="grid" x1="{x:.1f}" x2="{x:.1f}" y1="{frame.top}" y2="{bottom}"/>')
        parts.append(
            f'<text class="tick" x="{x:.1f}" y="{bottom + 13}" text-anchor="middle">{_label(t)}</text>'
        )
    parts.append(
        f'<text class="axis" x="{(frame.left + frame.width - frame.right) / 2:.0f}" y="{frame.height - 4}" '
        f'text-anchor="middle">{escape(x_label)}</text>'
    )
    parts.append(
        f'<text class="axis" x="12" y="{(frame.top + bottom) / 2:.0f}" text-anchor="middle" '
        f'transform="rotate(-90 12 {(frame.top + bottom) / 2:.0f})">{escape(y_label)}</text>'
    )
    return parts


def line_chart(
    title: str,
    lines: list[Series],
    y_label: str,
    *,
    x_label: str = "optimizer step",
    vlines: list[tuple[float, str]] = (),
    width: int = 720,
    height: int = 260,
) -> str:
    """An SVG line chart; `vlines`: (x, label) dashed vertical marks (e.g. where a session resumed).
    Empty string when no series has a point."""
    lines = [s for s in lines if s.points]
    if not lines:
        return ""
    xs = [x for s in lines for x, _ in s.points] + [x for x, _ in vlines]
    ys = [y for s in lines for _, y in s.points]
    # optimizer steps are whole and not negative: a run with one evaluation (step 0) had an axis of
    # -1, -0.5, 0, 0.5, 1, and a 3-step run a step 1.5
    x_range = (min(xs), max(max(xs), min(xs) + 1))
    y_range = (min(ys), max(ys))
    cut = _cut_top(lines, x_range, y_range)
    legend_rows = _legend_rows([s.label for s in lines], width - 60 - 12)
    # a legend too long for one row (a chart of many voices) wraps, and the plot starts below it
    plot_top = 26 + 14 * (len(legend_rows) - 1)
    height += plot_top - 26
    frame = Frame(width, height, x_range, (y_range[0], cut if cut is not None else y_range[1]), top=plot_top)
    parts = _axes(frame, x_label, y_label, x_step=1.0)
    top = frame.y_range[1]  # with its ticks: values above it are drawn at the edge, titled with their own

    def py(y: float) -> float:
        return frame.y(min(y, top))

    if cut is not None:
        parts.append(
            f'<text class="tick" x="{width - frame.right - 4}" y="{frame.top + 10}" text-anchor="end">'
            f"axis cut: the start reached {_label(y_range[1])}</text>"
        )
    for x, label in vlines:
        px = frame.x(x)
        parts.append(
            f'<line class="mark" x1="{px:.1f}" x2="{px:.1f}" y1="{frame.top}" y2="{height - frame.bottom}">'
            f"<title>{escape(label)}</title></line>"
        )
    legend = {}
    for k, s in enumerate(lines):
        color = COLORS[k % len(COLORS)]
        path = " ".join(f"{frame.x(x):.1f},{py(y):.1f}" for x, y in s.points)
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{path}"/>')
        if s.markers or len(s.points) == 1:
            for x, y in s.points:
                parts.append(
                    f'<circle cx="{frame.x(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}">'
                    f"<title>{escape(s.label)}: step {x:g}, {y:.4g}</title></circle>"
                )
        legend[k] = (
            f'<tspan fill="{color}">&#9632; </tspan><tspan>{escape(s.label)}</tspan><tspan>   </tspan>'
        )
    for row, members in enumerate(legend_rows):
        entries = "".join(legend[k] for k in members)
        parts.append(f'<text class="legend" x="{frame.left}" y="{14 + 14 * row}">{entries}</text>')
    return _svg(width, height, title, parts)


def _legend_rows(labels: list[str], width: float) -> list[list[int]]:
    """The indices of `labels` in legend rows that fit `width` pixels (about 6.5 px a character at the
    chart's 11 px font, with the swatch and the gap after it); one row when they all fit."""
    rows: list[list[int]] = [[]]
    used = 0.0
    for k, label in enumerate(labels):
        size = 6.5 * (len(label) + 5)
        if rows[-1] and used + size > width:
            rows.append([])
            used = 0.0
        rows[-1].append(k)
        used += size
    return rows


def _cut_top(lines: list[Series], x_range: tuple[float, float], y_range: tuple[float, float]) -> float | None:
    """The top of the y axis when the first tenth of the steps rose far above everything after (a
    fine-tune's start: val_mel 4.2, then 1.1-1.3), else None. Scaled to the start, the rest of the run
    was a flat line at the bottom of the chart. `y_range`: the lowest and highest of all the points."""
    low_x, high_x = x_range
    early_end = low_x + 0.1 * (high_x - low_x)
    late = [y for s in lines for x, y in s.points if x > early_end]
    if len(late) < 3:
        return None
    (low, high), late_top = y_range, max(late)
    if high - low <= 3 * (late_top - low):
        return None
    return late_top + max(0.25 * (late_top - low), 0.05 * abs(late_top))


def _svg(width: int, height: int, title: str, parts: list[str]) -> str:
    return (
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{escape(title)}">'
        f"<title>{escape(title)}</title>{''.join(parts)}</svg>"
    )


@dataclass
class Timeline:
    """One session on the wall clock, in seconds from its process start: phases (start, end, kind,
    label), instants (t, label, kind: deadline, plan, stop, event) and the budget's length."""

    title: str
    budget_seconds: float | None
    phases: list[tuple[float, float, str, str]] = field(default_factory=list)
    instants: list[tuple[float, str, str]] = field(default_factory=list)


def timeline_svg(timeline: Timeline, width: int = 900) -> str:
    """The session as bars on a time axis: loading, evaluations, micro-batch trial, training, the end
    (final evaluation, checkpoint, export); the deadline and the plan's marks as vertical lines. A
    deadline far beyond what was used (a run stopped by --max_steps or a signal) is left off the axis
    and named instead."""
    used = max(
        [end for _, end, _, _ in timeline.phases]
        + [t for t, _, k in timeline.instants if k in ("stop", "event")]
        + [1.0]
    )
    budget = timeline.budget_seconds or 0.0
    span = max(budget, used) if budget <= 1.5 * used else used  # an overrun stays on the axis too
    instants = [i for i in timeline.instants if i[0] <= span * 1.02]
    height = 110
    frame = Frame(width, height, (0.0, span * 1.02), (0.0, 1.0), left=20, top=30, bottom=34)
    parts = _axes(frame, "seconds since the process started", "", y_axis=False)
    row_top, row_height = 40, 30
    if span < budget:
        parts.append(
            f'<text class="tick note" x="{width - 12}" y="12" text-anchor="end">deadline at {budget:,.0f} s '
            f"(off the axis)</text>"
        )
    for start, end, kind, label in timeline.phases:
        row = row_top + (10 if kind == "eval" else 0)  # evaluations drawn over the phase they interrupt
        h = row_height - (20 if kind == "eval" else 0)
        x0, x1 = frame.x(max(0.0, start)), frame.x(max(start, end))
        parts.append(
            f'<rect x="{x0:.1f}" y="{row}" width="{max(1.5, x1 - x0):.1f}" height="{h}" '
            f'fill="{PHASE_COLORS.get(kind, "#999")}" opacity="0.85"><title>{escape(label)} '
            f"({start:.1f}-{end:.1f} s, {end - start:.1f} s)</title></rect>"
        )
    for t, label, kind in instants:
        x = frame.x(t)
        css = kind if kind in ("deadline", "stop", "plan") else "event"
        y0, y1 = (
            (row_top - 6, row_top + row_height + 6)
            if css != "event"
            else (row_top + row_height, row_top + row_height + 8)
        )
        parts.append(
            f'<line class="{css}" x1="{x:.1f}" x2="{x:.1f}" y1="{y0}" y2="{y1}">'
            f"<title>{escape(label)} ({t:.1f} s)</title></line>"
        )
        if kind in ("deadline", "stop"):
            anchor = "end" if x > width * 0.7 else "start"
            y = 12 if kind == "deadline" else 26
            parts.append(
                f'<text class="tick {css}" x="{x + (-3 if anchor == "end" else 3):.1f}" y="{y}" '
                f'text-anchor="{anchor}">{escape(label)}</text>'
            )
    return _svg(width, height, timeline.title, parts)
