"""The tables of the pages (docs/*.md, benchmarks/*.md) that a command prints, generated from its output.

A generated table sits between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``; this script
rewrites what is between from saved output, and tests/test_doc_tables.py checks that every such block is
what the saved output gives (and that today's code reproduces a cheap piece of it).

    kfca-llm fidelity --case all --out runs/fidelity            # about 2-6 minutes on two cores
    python benchmarks/doc_tables.py fidelity runs/fidelity/fidelity.json
        # saves it as benchmarks/fidelity.json, rewrites the fidelity-* tables

    for S in 0 1 2; do kfca-llm simulate --seed $S --out runs/r10-s$S; done
    python benchmarks/doc_tables.py check runs/r10-s0 runs/r10-s1 runs/r10-s2
        # rewrites the paper-llm table of docs/ci-check.md (smallest gap per seed)

    kfca-llm fidelity --case noniid --out runs/noniid              # about 15 s
    kfca-llm fidelity --case noniid-llm --out runs/noniid-llm      # 4-10 minutes
    python benchmarks/doc_tables.py noniid runs/noniid/noniid.json runs/noniid-llm/noniid_llm.json
        # saves them without their per-round records as benchmarks/noniid.json and benchmarks/noniid_llm.json,
        # rewrites the noniid-* tables

    python benchmarks/bench_aggregation.py --steps 2 --out runs/agg.json ...   # ROBUSTNESS.md gives the invocations
    python benchmarks/doc_tables.py aggregation runs/agg.json
        # saves it as benchmarks/aggregation.json, rewrites the aggregation-* tables and benchmarks/aggregation.png

    python benchmarks/doc_tables.py fidelity benchmarks/fidelity.json   # only re-renders a saved run

The fidelity and noniid commands also rewrite benchmarks/FREE_RIDERS.md's before/after tables (conditioning-*): the
saved runs beside the unconditioned ones of issue 43 (benchmarks/*_unconditioned.json, `--public-steps 0`).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SAVED_FIDELITY = ROOT / "benchmarks" / "fidelity.json"
SAVED_AGGREGATION = ROOT / "benchmarks" / "aggregation.json"
AGGREGATION_FIGURE = ROOT / "benchmarks" / "aggregation.png"
SAVED_NONIID = {"digits": ROOT / "benchmarks" / "noniid.json", "llm": ROOT / "benchmarks" / "noniid_llm.json"}
# The runs before KFCA-QP was conditioned on the public trajectory (issue 43; `--public-steps 0` reproduces them).
UNCONDITIONED_FIDELITY = ROOT / "benchmarks" / "fidelity_unconditioned.json"
UNCONDITIONED_NONIID = {"digits": ROOT / "benchmarks" / "noniid_unconditioned.json",
                        "llm": ROOT / "benchmarks" / "noniid_llm_unconditioned.json"}
BLOCK = re.compile(r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S)
# The per-case tables' columns, in the order of the paper's comparison.
METHOD_COLUMNS = ("kfca-qp", "kfca-d", "mc-kfca-qp", "ca-qp", "ca-d", "tmc-shapley", "group-testing", "gtg-shapley",
                  "mr", "tmr", "fed-sv", "uniform")
ESTIMATORS = ("exact-sv", "tmc-shapley", "group-testing", "gtg-shapley", "mr", "tmr", "fed-sv")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md"))]


def generated_blocks() -> list[tuple[Path, str, str]]:
    """(page, table name, text between the markers) of every generated table of the pages."""
    return [(p, m["name"], m["body"]) for p in pages() for m in BLOCK.finditer(p.read_text())]


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|---|" + "---:|" * (len(header) - 1)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)]) + "\n"


def _per_case(result: dict, keys: tuple[str, ...], cell) -> str:
    first = next(iter(result["cases"].values()))["methods"]
    keys = tuple(k for k in keys if k in first)
    rows = [[case, *(cell(data["methods"][k]) for k in keys)] for case, data in result["cases"].items()]
    return _markdown(["case", *(first[k]["name"] for k in keys)], rows)


def fidelity_tables(result: dict) -> dict[str, str]:
    """Every table the pages show of a ``kfca-llm fidelity`` run, by name."""
    from kfca_llm.valuation.fidelity import tables

    printed = tables(result)
    summary = printed[:printed.index("x exact: time / exact SV's time") + len("x exact: time / exact SV's time")]
    return {
        "fidelity-summary": f"```\n{summary}\n```\n",
        "fidelity-cosine": _per_case(result, METHOD_COLUMNS, lambda m: f"{m['distance']['cosine']:.4f}"),
        "fidelity-spearman": _per_case(result, METHOD_COLUMNS[:-1], lambda m: f"{m['spearman']:+.2f}"),
        "fidelity-seconds": _per_case(result, ("exact-sv", *METHOD_COLUMNS[:-1]), lambda m: f"{m['seconds']:.2f}"),
        "fidelity-coalitions": _per_case(result, ESTIMATORS, lambda m: f"{m['coalitions']:,}"),
    }


def noniid_levels(result: dict) -> str:
    """A sweep's table as the command prints it (one row per concentration, then the disjoint case), in markdown,
    with the count of pairs categorical in every round."""
    rows = []
    for level in [*result["levels"], {"concentration": "disjoint", **result["disjoint"]}]:
        s, alpha = level["summary"], level["concentration"]
        rows.append([alpha if isinstance(alpha, str) else f"{alpha:g}", f"{level['global_accuracy']:.3f}",
                     f"{s['pairs_hold_every_round']}/{s['pairs']}", f"{s['pair_rounds_hold']}/{s['pair_rounds']}",
                     *(f"{s[k]:+.4f}" for k in ("honest_reward", "deviation_reward", "honest_expected",
                                                 "deviation_expected", "labels_reward"))])
    table = _markdown(["Dirichlet", "accuracy", "pairs hold (every round)", "pair-rounds", "honest", "sign flipper",
                       "E(honest)", "E(flipper)", "KFCA-D"], rows)
    return table + (f"\nPairs categorical in every round over the five levels: **{result['pairs_hold']} of "
                    f"{result['pairs_total']}**.\n")


def _all_hold_from(result: dict) -> float | None:
    """The smallest concentration from which every pair holds in every round (None: not even at the last level)."""
    levels = result["levels"]
    first = next((i for i in range(len(levels)) if all(
        lv["summary"]["pairs_hold_every_round"] == lv["summary"]["pairs"] for lv in levels[i:])), None)
    return None if first is None else levels[first]["concentration"]


def _sweep_cells(result: dict, paper_level: float) -> list[str]:
    """One column of docs/evidence.md's comparison: pairs that hold, the paper's level, the disjoint case."""
    levels = {lv["concentration"]: lv for lv in result["levels"]}
    all_from = _all_hold_from(result)
    def count(lv: dict) -> str:
        return f"{lv['summary']['pairs_hold_every_round']} of {lv['summary']['pairs']} at {lv['concentration']:g}"

    if all_from is None:  # name every level
        held = f"{result['pairs_hold']} of {result['pairs_total']} (" + "; ".join(map(count, result["levels"])) + ")"
    else:
        below = [lv for lv in result["levels"] if result["levels"][0]["concentration"] < lv["concentration"] < all_from]
        held = (f"{result['pairs_hold']} of {result['pairs_total']} (all from {all_from:g} on"
                + "".join(f"; {count(lv)}" for lv in below) + ")")
    level = levels[paper_level]
    s = level["summary"]
    at_level = (f"accuracy {100 * level['global_accuracy']:.1f}%, honest {s['honest_reward']:+.3f}, sign flip "
                f"{s['deviation_reward']:+.3f}")
    d = result["disjoint"]["summary"]
    disjoint = (f"predictions: largest \\|delta\\| {d['max_abs_labels_delta']:.4f}, \\|KFCA-D reward\\| <= "
                f"{d['max_abs_labels_reward']:.4f}")
    return [held, at_level, disjoint]


def without_rounds(result: dict) -> dict:
    """A sweep's output without its per-round records (what the tables read, a hundredth of the size)."""
    drop = lambda level: {k: v for k, v in level.items() if k != "rounds"}  # noqa: E731
    return {**result, "levels": [drop(lv) for lv in result["levels"]], "disjoint": drop(result["disjoint"])}


def noniid_tables(digits: dict, llm: dict) -> dict[str, str]:
    """The sweeps' tables (FIDELITY.md) and docs/evidence.md's comparison with the paper."""
    ours_digits, ours_llm = _sweep_cells(digits, 0.1), _sweep_cells(llm, 0.1)
    paper = ["50 of 50 (MNIST + LeNet); AG News: all from 0.5 on", "accuracy 56%, honest +0.039, deviation -0.039",
             "Delta -> 0, rewards -> 0"]
    rows = [[name, p, d, m] for name, p, d, m in zip(
        ["pairs categorical in every round", "concentration 0.1", "disjoint classes"], paper, ours_digits, ours_llm)]
    comparison = "\n".join(["| | the paper | digits, small CNN (`noniid`) | tiny LLM, five topics (`noniid-llm`) |",
                            "|---|---|---|---|", *("| " + " | ".join(r) + " |" for r in rows)]) + "\n"
    return {"noniid-digits": noniid_levels(digits), "noniid-llm": noniid_levels(llm), "noniid-comparison": comparison}


def conditioning_tables() -> dict[str, str]:
    """benchmarks/FREE_RIDERS.md's before/after tables: the saved unconditioned runs beside the saved runs."""
    load = lambda path: json.loads(path.read_text())  # noqa: E731
    before, after = load(UNCONDITIONED_FIDELITY)["cases"], load(SAVED_FIDELITY)["cases"]
    keys = ("kfca-qp", "mc-kfca-qp")
    rows = []
    for case in [*after, "mean"]:
        cases = list(after) if case == "mean" else [case]
        cells = [case]
        for key in keys:
            for what, spec in (("cosine", ".4f"), ("spearman", "+.2f")):
                for run in (before, after):
                    values = [run[c]["methods"][key]["distance"][what] if what == "cosine"
                              else run[c]["methods"][key]["spearman"] for c in cases]
                    cells.append(format(sum(values) / len(values), spec))
        cells.append(format(sum(after[c]["methods"]["uniform"]["distance"]["cosine"] for c in cases) / len(cases),
                            ".4f"))
        rows.append(cells)
    fidelity = _markdown(["case", "KFCA-QP 1 - cos before", "after", "spearman before", "after",
                          "MC KFCA-QP 1 - cos before", "after", "spearman before", "after", "uniform 1 - cos"], rows)
    rows = []
    for kind, name in (("digits", "digits (`noniid`)"), ("llm", "tiny LLM (`noniid-llm`)")):
        b, a = load(UNCONDITIONED_NONIID[kind]), load(SAVED_NONIID[kind])
        pairs = [*zip(b["levels"], a["levels"]), ({"concentration": "disjoint", **b["disjoint"]},
                                                   {"concentration": "disjoint", **a["disjoint"]})]
        for lb, la in pairs:
            sb, sa = lb["summary"], la["summary"]
            alpha = la["concentration"]
            rows.append([name, alpha if isinstance(alpha, str) else f"{alpha:g}",
                         *(f"{x['pairs_hold_every_round']}/{x['pairs']}" for x in (sb, sa)),
                         *(f"{x['pair_rounds_hold']}/{x['pair_rounds']}" for x in (sb, sa)),
                         *(f"{x[key]:+.4f}" for key in ("honest_reward", "deviation_reward") for x in (sb, sa))])
        rows.append([name, "**all levels**", f"**{b['pairs_hold']}/{b['pairs_total']}**",
                     f"**{a['pairs_hold']}/{a['pairs_total']}**", "", "", "", "", "", ""])
    noniid = _markdown(["sweep", "Dirichlet", "pairs hold before", "after", "pair-rounds before", "after",
                        "honest before", "after", "sign flipper before", "after"], rows)
    return {"conditioning-fidelity": fidelity, "conditioning-noniid": noniid}


def aggregation_bench():
    """benchmarks/bench_aggregation.py as a module (the benchmarks folder is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_aggregation", ROOT / "benchmarks" / "bench_aggregation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WEAK_VERDICT_ROWS = ("honest", "exclude-negative", "krum", "fedmedian")
"""The goal's rows at 0.1: the oracle, exclude-negative under each scoring variant and weak-verdict rule, and the
Flower strategies that differ at 2 replies (FedTrimmedAvg is FedMedian there, MultiKrum is Krum, Bulyan refuses)."""


def aggregation_tables(grid: dict) -> dict[str, str]:
    """The aggregation benchmark's table per fraction (``aggregation-fraction-10``: 0.1) of the methods under the
    default settings, the variants (``--label``) beside the oracle and the best Flower strategies at 0.1
    (``aggregation-weak-verdicts``), and the goal lines."""
    bench = aggregation_bench()
    cells = grid["cells"]
    plain = [c for c in cells if bench.base_method(c["method"]) == c["method"]]
    tables = {f"aggregation-fraction-{round(100 * f)}": bench.table([c for c in plain if c["fraction"] == f]) + "\n"
              for f in sorted({c["fraction"] for c in cells})}
    tables["aggregation-weak-verdicts"] = bench.table(
        [c for c in cells if c["fraction"] == 0.1 and bench.base_method(c["method"]) in WEAK_VERDICT_ROWS]) + "\n"
    return {**tables, "aggregation-goal": "".join(f"- {line}\n" for line in bench.verdict(cells))}


def check_table(reports: list[str]) -> dict[str, str]:
    """docs/ci-check.md's table of the default expectations: each one's smallest gap on each run."""
    from kfca_llm.check import check_runs
    from kfca_llm.check_reports import load_runs
    from kfca_llm.expectations import load_expectations

    outcomes = check_runs(load_expectations("paper-llm"), load_runs(reports)).outcomes
    seeds = " / ".join(str(m.run.seed) for m in outcomes[0].runs)
    rows = [[o.expectation.title, expectation_check(o.expectation), expectation_margin(o.expectation),
             " / ".join(f"{m.gap:+.4f}" for m in o.runs)] for o in outcomes]
    rounds = {m.run.rounds for o in outcomes for m in o.runs}
    header = ["expectation", "check", "margin", f"smallest gap (tiny, {'/'.join(map(str, sorted(rounds)))} rounds, "
              f"seeds {seeds})"]
    lines = ["| " + " | ".join(header) + " |", "|---|---|---|---|"]
    return {"check-paper-llm": "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)]) + "\n"}


def expectation_check(e) -> str:
    """The check as the table shows it: code, ``|`` escaped for markdown, and the scope when not the mean."""
    text = "`" + e.check.replace("|", "\\|") + "`"
    return text + (", every round" if e.over == "every-round" else "")


def expectation_margin(e) -> str:
    def amount(value) -> str:
        return value if isinstance(value, str) else f"{value:g}"

    return f"tolerance {amount(e.tolerance)}" if e.tolerance else (amount(e.margin) if e.margin else "")


def rewrite(tables: dict[str, str]) -> list[str]:
    """Put each named table between its markers in every page; the pages changed."""
    changed = []
    for page in pages():
        text = page.read_text()
        new = BLOCK.sub(lambda m: m[1] + tables[m["name"]] + m[4] if m["name"] in tables else m[0], text)
        if new != text:
            page.write_text(new)
            changed.append(str(page.relative_to(ROOT)))
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("fidelity", help="tables of a kfca-llm fidelity run").add_argument("json")
    sub.add_parser("check", help="the paper-llm table from runs").add_argument("reports", nargs="+")
    sub.add_parser("aggregation", help="tables and figure of a bench_aggregation run").add_argument("json")
    sweeps = sub.add_parser("noniid", help="tables of the two non-IID sweeps")
    sweeps.add_argument("digits")
    sweeps.add_argument("llm")
    args = parser.parse_args(argv)
    if args.what == "fidelity":
        source = Path(args.json)
        result = json.loads(source.read_text())
        if source.resolve() != SAVED_FIDELITY:
            shutil.copyfile(source, SAVED_FIDELITY)
        tables = {**fidelity_tables(result), **conditioning_tables()}
    elif args.what == "noniid":
        results = {}
        for kind, source in (("digits", Path(args.digits)), ("llm", Path(args.llm))):
            results[kind] = without_rounds(json.loads(source.read_text()))
            if source.resolve() != SAVED_NONIID[kind]:
                SAVED_NONIID[kind].write_text(json.dumps(results[kind], indent=1) + "\n")
        tables = {**noniid_tables(results["digits"], results["llm"]), **conditioning_tables()}
    elif args.what == "aggregation":
        source = Path(args.json)
        grid = json.loads(source.read_text())
        if source.resolve() != SAVED_AGGREGATION:
            SAVED_AGGREGATION.write_text(json.dumps(grid, indent=1) + "\n")
        tables = aggregation_tables(grid)
        aggregation_bench().plot(grid["cells"], AGGREGATION_FIGURE)
    else:
        tables = check_table(args.reports)
    print("rewrote:", ", ".join(rewrite(tables)) or "nothing (already up to date)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
