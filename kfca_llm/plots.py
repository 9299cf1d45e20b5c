"""Figures of a simulation, drawn from its ``report.json`` dict (so they can be redrawn from the file).

* ``plot_rewards``: like the paper's attack-analysis figure. One column per report (domain); top row the
  reward of every strategy per round (one line style and marker per attack family, each line labelled at
  its end, honest drawn on top), bottom row the mean reward per strategy, sorted.
* ``plot_delta``: the empirical delta matrices of the honest pairs. A binary delta matrix has one degree of
  freedom (rows and columns sum to zero: ``delta = [[d, -d], [-d, d]]``), so each report gets one row:
  the mean 2x2 matrix over the rounds as an annotated heatmap (diverging colours centred on 0, with a
  colour bar; labels negative / non-negative as in the report), and ``d`` per round as bars, green where
  the categorical-world condition holds (``d > 0``) and red where it breaks.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only; never needs a display
import matplotlib.pyplot as plt  # noqa: E402

Report = Mapping[str, Any]

DOMAIN_COLOURS = {"general-nlp": "#1f77b4", "finance": "#2ca02c", "medical": "#9467bd", "code": "#ff7f0e"}
LABELS = ("negative", "non-negative")  # delta rows/columns, as in RewardReport.labels
HOLDS_COLOUR, BROKEN_COLOUR = "#2ca02c", "#d62728"
# (line style, marker) per attack family: colours alone do not separate lagged from sparse in print.
FAMILY_STYLES = {"honest": ("-", "o"), "stale": ("--", "s"), "lagged": ("-.", "^"), "sparse": (":", "D"),
                 "flip": ("-", "X"), "zero": ((0, (1, 1)), "v"), "random": ((0, (5, 1, 1, 1)), "P"),
                 **dict.fromkeys(("free-ride", "free-ride-flip", "free-ride-noise", "free-ride-signs"),
                                 ((0, (4, 1, 1, 1, 1, 1)), "h"))}
# Free riders (kfca_llm.attacks_public) share a style; a colour tells the variants apart.
FREE_RIDER_COLOURS = {"free-ride": "#8c564b", "free-ride-noise": "#c49c94", "free-ride-signs": "#bcbd22",
                      "free-ride-flip": "#e377c2"}


def strategy_style(spec: str) -> tuple[Any, str]:
    """(line style, marker) of a strategy's family; user attacks get a dashed line with stars."""
    return FAMILY_STYLES.get(spec.partition(":")[0], ((0, (3, 2)), "*"))


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
    return {"flip": "#d62728", "zero": "#7f7f7f", "random": "#9467bd", **FREE_RIDER_COLOURS}.get(name, "#17becf")


def _title(report: Report) -> str:
    return f"{report['domain']} (seed {report['seed']})"


def save_figure(fig, path: str | Path) -> None:
    """Render to memory, then write atomically: a half-written PNG never replaces a good one."""
    from .report import write_atomic

    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, dpi=130, bbox_inches="tight", format=Path(path).suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    write_atomic(path, buffer.getvalue())


def _end_label_positions(values: Sequence[float], gap: float) -> list[float]:
    """Vertical positions for end labels: the values, pushed apart to at least ``gap``, order kept."""
    order = sorted(range(len(values)), key=lambda k: values[k])
    placed = [0.0] * len(values)
    previous = None
    for k in order:
        y = values[k] if previous is None else max(values[k], previous + gap)
        placed[k] = previous = y
    shift = (max(placed) - max(values)) / 2 if values else 0.0  # recentre the stack on the data
    return [y - shift for y in placed]


def plot_rewards(reports: Sequence[Report], path: str | Path) -> None:
    """Reward trajectories (top) and sorted mean rewards (bottom), one column per report."""
    n = len(reports)
    fig, axes = plt.subplots(2, n, figsize=(7.4 * n, 8.6), squeeze=False,
                             gridspec_kw={"height_ratios": [1.2, 1.0]})
    for col, report in enumerate(reports):
        top, bottom = axes[0, col], axes[1, col]
        strategies = report["strategies"]
        order = sorted(strategies, key=lambda s: strategies[s]["mean_reward"], reverse=True)
        rounds = report["rounds"]
        ends = []
        for spec in order:
            per_round = strategies[spec]["per_round"]
            style, marker = strategy_style(spec)
            honest = spec == "honest"
            # honest on top and larger: in round 1 stale and lagged:K equal it exactly and would hide it
            top.plot(range(1, len(per_round) + 1), per_round, linestyle=style, marker=marker,
                     ms=7 if honest else 4.5, lw=2.4 if honest else 1.4, color=strategy_colour(spec), label=spec,
                     zorder=5 if honest else 3, mfc="white" if honest else None, mew=1.6 if honest else 1.0)
            ends.append((spec, len(per_round), per_round[-1]))
        values = [v for _, _, v in ends]
        ylo, yhi = top.get_ylim()
        for (spec, x, value), y in zip(ends, _end_label_positions(values, 0.045 * (yhi - ylo))):
            top.annotate(spec, xy=(x, value), xytext=(x + 0.35, y), fontsize=8, va="center",
                         color=strategy_colour(spec), arrowprops={"arrowstyle": "-", "color": "#bbbbbb", "lw": 0.6})
        top.set_xlim(0.6, rounds + 0.3 + 0.12 * rounds + 0.8)
        top.axhline(0.0, color="black", lw=0.6)
        top.set_title(_title(report))
        top.set_xlabel("round")
        top.set_ylabel("KFCA-QP reward")
        top.set_xticks(range(1, rounds + 1))
        top.grid(alpha=0.3)
        means = [strategies[s]["mean_reward"] for s in order]
        bars = bottom.barh(range(len(order)), means, color=[strategy_colour(s) for s in order])
        bottom.set_yticks(range(len(order)), order)
        bottom.invert_yaxis()
        bottom.axvline(0.0, color="black", lw=0.6)
        bottom.set_xlabel(f"mean reward over {rounds} rounds")
        extent = max((abs(m) for m in means), default=1.0) or 1.0
        bottom.set_xlim(-1.35 * extent, 1.35 * extent)
        for bar, m in zip(bars, means):
            bottom.text(m + (0.02 if m >= 0 else -0.02) * extent, bar.get_y() + bar.get_height() / 2, f"{m:+.3f}",
                        va="center", ha="left" if m >= 0 else "right", fontsize=8)
        bottom.grid(axis="x", alpha=0.3)
    fig.suptitle("KFCA-QP rewards under attack strategies (line style and marker: attack family)")
    fig.tight_layout()
    save_figure(fig, path)


def plot_delta(reports: Sequence[Report], path: str | Path) -> None:
    """Mean 2x2 delta heatmap and the diagonal entry per round (categorical world: > 0), one row per report."""
    rows = len(reports)
    fig, axes = plt.subplots(rows, 2, figsize=(11.0, 3.3 * rows + 0.5), squeeze=False,
                             gridspec_kw={"width_ratios": [1.0, 2.4]})
    # A round with no pair of honest updates (one honest client beside an attacker) has no delta (None).
    scale = max((abs(v) for r in reports for d in r["delta"] if d is not None for line in d for v in line),
                default=1.0) or 1.0
    for row, report in enumerate(reports):
        deltas = [d for d in report["delta"] if d is not None]
        mean = [[sum(d[a][b] for d in deltas) / len(deltas) if deltas else 0.0 for b in range(2)] for a in range(2)]
        heat, bars = axes[row, 0], axes[row, 1]
        image = heat.imshow(mean, cmap="RdBu", vmin=-scale, vmax=scale)
        for a in range(2):
            for b in range(2):
                heat.text(b, a, f"{mean[a][b]:+.4f}", ha="center", va="center", fontsize=10,
                          color="white" if abs(mean[a][b]) > 0.6 * scale else "black")
        heat.set_xticks([0, 1], LABELS)
        heat.set_yticks([0, 1], LABELS)
        heat.set_xlabel("peer's report")
        heat.set_ylabel(f"{report['domain']}\nclient's report", color=DOMAIN_COLOURS.get(report["domain"], "black"))
        heat.set_title(f"mean over {len(deltas)} rounds", fontsize=9)
        colourbar = fig.colorbar(image, ax=heat, fraction=0.046, pad=0.04)
        colourbar.set_label("delta = P(a, b) - P(a) P(b)", fontsize=8)
        holds = report["categorical_world"]
        diagonal = [0.0 if d is None else d[0][0] for d in report["delta"]]
        x = range(1, len(diagonal) + 1)
        bars.bar(x, diagonal, color=[HOLDS_COLOUR if ok else BROKEN_COLOUR for ok in holds[:len(diagonal)]])
        bars.axhline(0.0, color="black", lw=0.8)
        bars.set_xticks(list(x))
        bars.set_xlabel("round")
        bars.set_ylabel("delta(negative, negative)")
        broken = [t for t, ok in zip(x, holds) if not ok]
        verdict = (f"categorical world holds in all {len(diagonal)} rounds" if not broken
                   else f"categorical world BROKEN in round(s) {', '.join(map(str, broken))}")
        bars.set_title(f"{_title(report)}: {verdict} (green: diagonal > 0, red: not)", fontsize=9,
                       color="black" if not broken else BROKEN_COLOUR)
        bars.grid(axis="y", alpha=0.3)
    fig.suptitle("Empirical delta matrices of sign-quantized honest updates (binary: delta = [[d, -d], [-d, d]])",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def plot_heldout(report: Report, path: str | Path) -> None:
    """The global adapter's held-out loss (left) and exact-answer accuracy (right) after each round."""
    heldout = report["heldout"]
    x = list(range(1, len(heldout["loss"]) + 1))
    fig, (loss, accuracy) = plt.subplots(1, 2, figsize=(10.0, 3.4))
    loss.plot(x, heldout["loss"], marker="o", color="#1f77b4")
    loss.set_ylabel("held-out loss (response tokens)")
    accuracy.plot(x, [100 * a for a in heldout["accuracy"]], marker="o", color="#2ca02c")
    accuracy.set_ylabel("exact answers (%)")
    accuracy.set_ylim(-2, 102)
    for ax in (loss, accuracy):
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    aggregate = report.get("config", {}).get("kfca", {}).get("aggregate", "?")
    fig.suptitle(f"Global adapter on {heldout['rows']} held-out rows: {_title(report)}, kfca.aggregate = {aggregate}",
                 fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
