"""Figures of a simulation, drawn from its ``report.json`` dict (so they can be redrawn from the file).

* ``plot_rewards``: like the paper's attack-analysis figure. One column per report (domain); top row the
  reward of every strategy per round, bottom row the mean reward per strategy, sorted.
* ``plot_delta``: like the paper's delta figure. One row per report, one 2x2 matrix per round (the mean
  empirical delta matrix of the round's honest pairs), annotated; diagonal cells in the report's colour,
  off-diagonal cells in red, a mark on rounds that break the categorical-world condition.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

Report = Mapping[str, Any]

DOMAIN_COLOURS = {"general-nlp": "#1f77b4", "finance": "#2ca02c", "medical": "#9467bd", "code": "#ff7f0e"}
OFF_DIAGONAL_COLOUR = "#d62728"
LABELS = ("-1", "+1")  # delta rows/columns: negative, non-negative report


def strategy_colour(spec: str) -> str:
    """A colour per attack family: honest green, temporal blues, sparse oranges, destructive red/grey."""
    name, _, param = spec.partition(":")
    if name == "honest":
        return "#2ca02c"
    if name == "stale":
        return "#08306b"
    if name == "lagged":
        shades = {2: "#6baed6", 3: "#4292c6", 4: "#2171b5", 5: "#08519c"}
        return shades.get(int(param), "#3182bd") if param.isdigit() else "#3182bd"
    if name == "sparse":
        try:
            p = float(param)
        except ValueError:
            return "#fd8d3c"
        return matplotlib.colormaps["Oranges"](0.35 + 0.5 * p)
    return {"flip": "#d62728", "zero": "#7f7f7f", "random": "#9467bd"}.get(name, "#17becf")


def _title(report: Report) -> str:
    return f"{report['domain']} (seed {report['seed']})"


def _save(fig, path: str | Path) -> None:
    """Render to memory, then write atomically: a half-written PNG never replaces a good one."""
    from .report import write_atomic

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=130, bbox_inches="tight", format=Path(path).suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    write_atomic(path, buffer.getvalue())


def plot_rewards(reports: Sequence[Report], path: str | Path) -> None:
    """Reward trajectories (top) and sorted mean rewards (bottom), one column per report."""
    n = len(reports)
    fig, axes = plt.subplots(2, n, figsize=(6.2 * n, 8.2), squeeze=False,
                             gridspec_kw={"height_ratios": [1.0, 1.1]})
    for col, report in enumerate(reports):
        top, bottom = axes[0, col], axes[1, col]
        strategies = report["strategies"]
        order = sorted(strategies, key=lambda s: strategies[s]["mean_reward"], reverse=True)
        for spec in order:
            per_round = strategies[spec]["per_round"]
            top.plot(range(1, len(per_round) + 1), per_round, marker="o", ms=3, lw=1.4,
                     color=strategy_colour(spec), label=spec)
        top.axhline(0.0, color="black", lw=0.6)
        top.set_title(_title(report))
        top.set_xlabel("round")
        top.set_ylabel("KFCA-QP reward")
        top.set_xticks(range(1, report["rounds"] + 1))
        top.grid(alpha=0.3)
        means = [strategies[s]["mean_reward"] for s in order]
        bars = bottom.barh(range(len(order)), means, color=[strategy_colour(s) for s in order])
        bottom.set_yticks(range(len(order)), order)
        bottom.invert_yaxis()
        bottom.axvline(0.0, color="black", lw=0.6)
        bottom.set_xlabel(f"mean reward over {report['rounds']} rounds")
        span = max((abs(m) for m in means), default=1.0) or 1.0
        bottom.set_xlim(-1.35 * span, 1.35 * span)
        for bar, m in zip(bars, means):
            bottom.text(m + (0.02 if m >= 0 else -0.02) * span, bar.get_y() + bar.get_height() / 2, f"{m:+.3f}",
                        va="center", ha="left" if m >= 0 else "right", fontsize=8)
        bottom.grid(axis="x", alpha=0.3)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), fontsize=8,
               bbox_to_anchor=(0.5, 1.0), frameon=False)
    fig.suptitle("KFCA-QP rewards under attack strategies", y=1.04)
    fig.tight_layout()
    _save(fig, path)


def plot_delta(reports: Sequence[Report], path: str | Path) -> None:
    """2x2 empirical delta matrices per round (columns), one row per report."""
    rows = len(reports)
    cols = max(r["rounds"] for r in reports)
    fig, axes = plt.subplots(rows, cols, figsize=(1.55 * cols + 0.8, 1.75 * rows + 0.6), squeeze=False)
    for row, report in enumerate(reports):
        colour = DOMAIN_COLOURS.get(report["domain"], "#1f77b4")
        deltas = report["delta"]
        scale = max((abs(v) for d in deltas for line in d for v in line), default=1.0) or 1.0
        for col in range(cols):
            ax = axes[row, col]
            ax.set_xticks([])
            ax.set_yticks([])
            if col >= len(deltas):
                ax.axis("off")
                continue
            d = deltas[col]
            for a in range(2):
                for b in range(2):
                    v = d[a][b]
                    base = colour if a == b else OFF_DIAGONAL_COLOUR
                    ax.add_patch(plt.Rectangle((b, 1 - a), 1, 1, color=to_rgba(base, 0.15 + 0.75 * abs(v) / scale)))
                    ax.text(b + 0.5, 1.5 - a, f"{v:+.3f}", ha="center", va="center", fontsize=7)
            ax.set_xlim(0, 2)
            ax.set_ylim(0, 2)
            ax.set_aspect("equal")
            ok = report["categorical_world"][col]
            ax.set_title(f"r{col + 1}" + ("" if ok else " (not cat.)"), fontsize=8,
                         color="black" if ok else OFF_DIAGONAL_COLOUR)
            if row == rows - 1:
                ax.set_xticks([0.5, 1.5], LABELS, fontsize=7)
            if col == 0:
                ax.set_yticks([1.5, 0.5], LABELS, fontsize=7)
                ax.set_ylabel(report["domain"], fontsize=9, color=colour)
    fig.suptitle("Empirical delta matrices of sign-quantized honest updates "
                 "(rows: client report, columns: peer report)", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
