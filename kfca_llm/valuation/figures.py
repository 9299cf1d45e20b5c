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
