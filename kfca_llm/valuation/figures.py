"""Figures of ``kfca-llm fidelity``, drawn from its ``fidelity.json`` dict (redrawable from the file)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..plots import plt, save_figure

MARKERS = {"iid": "o", "label_skew": "s", "size_skew": "^", "label_noise": "D", "feature_noise": "v"}
COLOURS = {"exact-sv": "#000000", "mr": "#1f77b4", "gtg-shapley": "#17becf", "tmc-shapley": "#9467bd",
           "group-testing": "#e377c2", "fed-sv": "#8c564b", "tmr": "#aec7e8",
           "ca-qp": "#ff7f0e", "ca-d": "#bcbd22", "kfca-qp": "#2ca02c", "kfca-d": "#98df8a",
           "mc-kfca-qp": "#006d2c", "uniform": "#7f7f7f"}
TIME_FLOOR = 1e-4  # seconds: uniform takes no time; drawn at this floor on the log axis


def _colour(key: str) -> str:
    return COLOURS.get(key, "#d62728")


def plot_distance_vs_time(result: Mapping, path: str | Path) -> None:
    """Cosine distance to exact SV against computation time (log), one marker per method and case."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    seen = set()
    for case, data in result["cases"].items():
        for key, m in data["methods"].items():
            if key == "exact-sv":
                continue
            ax.scatter(max(m["seconds"], TIME_FLOOR), m["distance"]["cosine"], color=_colour(key),
                       marker=MARKERS.get(case, "o"), s=36, edgecolor="black", linewidth=0.4,
                       label=m["name"] if key not in seen else None)
            seen.add(key)
    for case, marker in MARKERS.items():
        if case in result["cases"]:
            ax.scatter([], [], marker=marker, color="white", edgecolor="black", label=case)
    exact_s = np.mean([d["methods"]["exact-sv"]["seconds"] for d in result["cases"].values()])
    ax.axvline(exact_s, color="black", ls="--", lw=0.8, label="exact SV time")
    ax.set_xscale("log")
    ax.set_xlabel("computation time (s, log)")
    ax.set_ylabel("1 - cos(exact SV, rewards)")
    ax.set_title(f"distance to exact SV vs time ({result['clients']} clients, {result['data']})", fontsize=9)
    ax.legend(fontsize=7, ncol=2, loc="best")
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def plot_variance(result: Mapping, path: str | Path) -> None:
    """Variance of the normalised reward distribution per case and method (exact SV first)."""
    cases = list(result["cases"])
    keys = list(result["cases"][cases[0]]["methods"])
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(cases)), 3.8))
    width = 0.8 / len(keys)
    for k, key in enumerate(keys):
        values = [result["cases"][c]["methods"][key]["variance"] for c in cases]
        ax.bar(np.arange(len(cases)) + (k - (len(keys) - 1) / 2) * width, values, width, color=_colour(key),
               label=result["cases"][cases[0]]["methods"][key]["name"])
    ax.set_xticks(range(len(cases)), cases)
    ax.set_ylabel("variance of normalised rewards")
    ax.legend(fontsize=7, ncol=2)
    save_figure(fig, path)


def plot_rewards(result: Mapping, path: str | Path) -> None:
    """Per-client normalised rewards, one panel per case, every method beside exact SV."""
    cases = list(result["cases"])
    fig, axes = plt.subplots(len(cases), 1, figsize=(9.0, 2.6 * len(cases)), squeeze=False)
    for ax, case in zip(axes[:, 0], cases):
        methods = result["cases"][case]["methods"]
        n = len(methods["exact-sv"]["normalised"])
        width = 0.85 / len(methods)
        for k, (key, m) in enumerate(methods.items()):
            ax.bar(np.arange(n) + (k - (len(methods) - 1) / 2) * width, m["normalised"], width,
                   color=_colour(key), label=m["name"])
        ax.axhline(0.0, color="black", lw=0.5)
        ax.set_title(case, fontsize=9)
        ax.set_xticks(range(n), [str(i + 1) for i in range(n)])
        ax.set_ylabel("q_i / sum q")
    axes[0, 0].legend(fontsize=6, ncol=5)
    axes[-1, 0].set_xlabel("client")
    save_figure(fig, path)


def plot_noniid(result: Mapping, path: str | Path) -> None:
    """Left: honest vs deviating KFCA-QP reward per Dirichlet concentration and for disjoint classes.
    Right: every pair-round's delta(0, 0) (positive = categorical in the binary case)."""
    levels = [*result["levels"], {"concentration": "disjoint", **result["disjoint"]}]
    labels = [f"{lv['concentration']:g}" if not isinstance(lv["concentration"], str) else "disjoint" for lv in levels]
    x = np.arange(len(levels))
    fig, (left, right) = plt.subplots(1, 2, figsize=(10.0, 3.8))
    for key, colour, name in (("honest_reward", "#2ca02c", "honest"), ("deviation_reward", "#d62728", "one sign-flipper"),
                              ("labels_reward", "#1f77b4", "KFCA-D (predicted labels)")):
        left.plot(x, [lv["summary"][key] for lv in levels], marker="o", color=colour, label=name)
    left.axhline(0.0, color="black", lw=0.6)
    left.set_xticks(x, labels)
    left.set_xlabel("Dirichlet concentration")
    left.set_ylabel("mean reward")
    left.legend(fontsize=7)
    for k, lv in enumerate(levels):
        d00 = np.array([p["delta"][0][0] for r in lv["rounds"] for p in r["pairs"]])
        ok = np.array([p["categorical"] for r in lv["rounds"] for p in r["pairs"]])
        jitter = np.linspace(-0.25, 0.25, d00.size)
        right.scatter(k + jitter[ok], d00[ok], s=6, color="#2ca02c")
        right.scatter(k + jitter[~ok], d00[~ok], s=10, color="#d62728", marker="x")
    right.axhline(0.0, color="black", lw=0.6)
    right.set_xticks(x, labels)
    right.set_xlabel("Dirichlet concentration")
    right.set_ylabel("delta(0, 0) per pair and round")
    right.set_title(f"{result['pairs_hold']}/{result['pairs_total']} pairs categorical in every round "
                    "(x: not categorical)", fontsize=8)
    fig.suptitle(f"non-IID sweep, {result['data']}", fontsize=9)
    fig.subplots_adjust(wspace=0.3)
    save_figure(fig, path)
