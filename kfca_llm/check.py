"""Check a federation's rewards against expectations (the work of ``kfca-llm check``).

``load_runs`` reads ``report.json`` files (or run folders, or the folder of a multi-seed run with its
``summary.json``), ``check_runs`` measures every expectation on every run and ``CheckResult`` prints the
table and the failures, and writes JUnit XML. A link ``a > b`` of a chain has the *gap* ``a - b`` (``b - a``
for ``<``); an expectation holds on a run when its smallest gap, over links (and rounds, for
``every-round``), exceeds the margin. A link between two strategies that submit the same update in every
round read (``lagged:2`` and ``stale`` replay round 1's until round 3) is not measurable on that run unless a
tolerance lets them tie: the check names the rounds a run needs instead of reporting a failure.
"""

from __future__ import annotations

import json
import math
import os
import stat
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from .attacks import first_round_apart
from .errors import InputError
from .expectations import Chain, Expectation, ExpectationSet, Term

MAX_LISTED = 8  # breaches listed per run in a failure (the rest are counted)


# ----------------------------------------------------------------------------------------------------------
# Runs: the part of report.json a check reads, validated (report files are user input)

Number = StrictFloat | StrictInt


class _Strategy(BaseModel):
    model_config = ConfigDict(extra="ignore")
    per_round: list[Number]


class _Pair(BaseModel):
    model_config = ConfigDict(extra="ignore")
    client: StrictStr
    peer: StrictStr
    honest_pair: StrictBool
    delta: list[list[Number]]


class _Round(BaseModel):
    model_config = ConfigDict(extra="ignore")
    pairs: list[_Pair]


class _Report(BaseModel):
    model_config = ConfigDict(extra="ignore")
    seed: StrictInt
    rounds: StrictInt
    strategies: dict[str, _Strategy]
    round_records: list[_Round] | None = None
    recipe: StrictStr | None = None


@dataclass(frozen=True)
class HonestPair:
    client: str
    peer: str
    delta: np.ndarray


@dataclass(frozen=True)
class Run:
    """One federation's report: rewards per strategy per round, and the honest pairs' delta matrices."""

    path: Path
    seed: int
    rewards: dict[str, np.ndarray]
    honest_pairs: list[list[HonestPair]] | None
    """Per round (None when the report has no ``round_records``)."""

    @property
    def rounds(self) -> int:
        return len(next(iter(self.rewards.values())))

    @property
    def figure(self) -> Path:
        return self.path.parent / "rewards.png"


MAX_REPORT_BYTES = 1 << 30


def _report_text(path: Path) -> str:
    """A report file's text: a regular file (a FIFO is refused without waiting for a writer), at most 1 GiB."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"report {path}: cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"report {path} is not a regular file; not read")
        if info.st_size > MAX_REPORT_BYTES:
            raise InputError(f"report {path}: {info.st_size} bytes, more than any report ({MAX_REPORT_BYTES})")
        data = handle.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"report {path}: not UTF-8 text ({exc})") from None


def _finite(values, what: str) -> np.ndarray:
    """``values`` as a float array: refused when a value overflows a float or is infinite (NaN stays: it never
    holds an expectation)."""
    try:
        array = np.asarray(values, dtype=float)
    except OverflowError:
        raise InputError(f"{what}: a number too large for a float") from None
    if np.isinf(array).any():
        raise InputError(f"{what}: an infinite value")
    return array


def load_report(path: Path) -> Run:
    """A run from one ``report.json``; InputError names the file and what is wrong."""
    text = _report_text(path)
    try:
        raw = json.loads(text)
    except RecursionError:
        raise InputError(f"report {path}: cannot be read as JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and integers past Python's digit limit
        raise InputError(f"report {path}: cannot be read as JSON: {str(exc)[:200]}") from None
    try:
        report = _Report.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        key = ".".join(str(part) for part in err["loc"])
        raise InputError(f"report {path}: key {key[:200]!r}: {err['msg']}") from None
    if abs(report.seed) >= 1 << 64:
        raise InputError(f"report {path}: the seed is not a 64-bit integer")
    if not report.strategies:
        raise InputError(f"report {path} has no strategies (the recipe's kfca.attacks is empty)")
    for spec, entry in report.strategies.items():
        if len(entry.per_round) != report.rounds or report.rounds < 1:
            raise InputError(f"report {path}: strategy {spec!r} has {len(entry.per_round)} per-round rewards "
                             f"for {report.rounds} rounds")
    pairs = None
    if report.round_records is not None:
        if len(report.round_records) != report.rounds:
            raise InputError(f"report {path}: {len(report.round_records)} round records for {report.rounds} rounds")
        pairs = []
        for t, record in enumerate(report.round_records, start=1):
            honest = []
            for p in record.pairs:
                where = f"report {path}: round {t}: the delta of {p.client!r} ~ {p.peer!r}"
                try:
                    delta = _finite(p.delta, where)
                except InputError:
                    raise
                except ValueError:  # rows of different lengths: not a matrix
                    delta = np.zeros(0)
                if delta.ndim != 2 or delta.shape[0] != delta.shape[1] or delta.shape[0] < 2:
                    raise InputError(f"report {path}: round {t}: the delta of {p.client!r} ~ {p.peer!r} "
                                     "is not a square matrix")
                if p.honest_pair:
                    honest.append(HonestPair(p.client, p.peer, delta))
            pairs.append(honest)
    rewards = {spec: _finite(entry.per_round, f"report {path}: strategy {spec!r}")
               for spec, entry in report.strategies.items()}
    return Run(path=path, seed=report.seed, rewards=rewards, honest_pairs=pairs)


def _summary_reports(folder: Path) -> list[Path]:
    """The report files a multi-seed run's ``summary.json`` lists (paths inside ``folder`` only)."""
    summary = folder / "summary.json"
    try:
        runs = json.loads(_report_text(summary))["runs"]
        paths = [Path(p) for p in runs.values()]
    except RecursionError:
        raise InputError(f"{summary}: not a multi-seed summary (JSON nested too deeply)") from None
    except InputError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{summary}: not a multi-seed summary ({str(exc)[:200]})") from None
    inside = folder.resolve()
    if not paths or any(p.is_absolute() or ".." in p.parts or not (folder / p).resolve().is_relative_to(inside)
                        for p in paths):
        raise InputError(f"{summary}: 'runs' must list report paths inside {folder}")
    return [folder / p for p in paths]


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Runs from ``report.json`` files, run folders (holding one), or multi-seed folders (``summary.json``)."""
    files: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            if (path / "report.json").is_file():
                files.append(path / "report.json")
            elif (path / "summary.json").is_file():
                files.extend(_summary_reports(path))
            else:
                raise InputError(f"{path} holds no report.json nor summary.json")
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"no report {path}")
    return [load_report(f) for f in files]


# ----------------------------------------------------------------------------------------------------------
# Measuring


@dataclass(frozen=True)
class Breach:
    """A link whose gap did not exceed the margin: on one round, or on the mean (``round`` None)."""

    round: int | None
    left: str
    left_value: float
    right: str
    right_value: float
    gap: float
    rounds_broken: tuple[int, ...] = ()
    """For a breach of the mean: the rounds in which the same link broke on its own."""


@dataclass(frozen=True)
class Unmeasured:
    """A link between two strategies that submit the same update in every round the check reads (``lagged:2``
    and ``stale`` replay round 1's in rounds 1-3): its gap is 0 by construction, not a measurement."""

    link: str
    rounds: tuple[int, int]
    """The first and last round read."""
    needs_rounds: int
    """The rounds a run needs for the two to submit different updates."""


@dataclass(frozen=True)
class RunOutcome:
    run: Run
    gap: float
    """The smallest gap over the measured links (NaN when a value is not a number, which never holds, or when
    no link could be measured)."""
    holds: bool
    """No measured link broke."""
    breaches: tuple[Breach, ...]
    worst: str
    """The link (or honest pair) of the smallest gap."""
    unmeasured: tuple[Unmeasured, ...] = ()

    @property
    def needs_rounds(self) -> int | None:
        """The rounds a run needs to measure every link (None: this one measured them all)."""
        return max((u.needs_rounds for u in self.unmeasured), default=None)


@dataclass(frozen=True)
class Outcome:
    expectation: Expectation
    runs: tuple[RunOutcome, ...]
    passed: bool
    quantile_gap: float | None = None
    """With ``seeds = q``: the q-quantile of the runs' gaps (numpy's 'lower': one run's own gap)."""
    needs_rounds: int | None = None
    """Set when nothing measured broke but a link could not be measured: the rounds a run needs."""

    @property
    def failed(self) -> bool:
        return not self.passed and self.needs_rounds is None


def _smallest(candidates: list[tuple[float, str]]) -> tuple[float, str]:
    """The smallest (gap, where); a NaN gap comes first: it never holds."""
    return min(candidates, key=lambda c: (not math.isnan(c[0]), c[0]))


def _rounds(expectation: Expectation, run: Run) -> np.ndarray:
    if expectation.from_round > run.rounds:
        raise InputError(f"expectation {expectation.title!r} starts at round {expectation.from_round}, but "
                         f"{run.path} has {run.rounds} rounds")
    return np.arange(expectation.from_round, run.rounds + 1)


def require_strategies(expectations: ExpectationSet, strategies: Sequence[str], where: str) -> None:
    """InputError unless every strategy the expectations name is among ``strategies`` (a run's, or a recipe's
    kfca.attacks before a run)."""
    named = {s: None for e in expectations.expect if e.chain is not None for s in e.chain.named}
    missing = [s for s in named if s not in strategies]
    if missing:
        import difflib

        close = {c for s in missing for c in difflib.get_close_matches(s, strategies, n=2)}
        hint = f" (close: {', '.join(sorted(close))})" if close else ""
        raise InputError(f"{where} has no strategy {', '.join(map(repr, missing))}{hint}; its strategies: "
                         f"{', '.join(strategies)} (kfca.attacks or --attacks lists what a run analyses)")


def _links(chain: Chain, run: Run) -> list[tuple[Term, Term]]:
    """Neighbouring terms of the chain, with ``*`` expanded to every strategy it does not name."""
    others = [s for s in run.rewards if s not in chain.named]
    expanded: list[list[Term]] = []
    for term in chain.terms:
        if term.others and not others:
            raise InputError(f"'*' in {str(chain)!r} stands for no strategy of {run.path}")
        expanded.append([Term(strategy=s) for s in others] if term.others else [term])
    return [(a, b) for left, right in zip(expanded, expanded[1:]) for a in left for b in right]


def _term_values(term: Term, run: Run, rounds: np.ndarray, mean: bool) -> np.ndarray:
    if term.strategy is None:
        return np.full(1 if mean else len(rounds), term.constant)
    values = run.rewards[term.strategy][rounds - 1]
    return np.asarray([term.value(float(values.mean()))]) if mean else np.asarray([term.value(v) for v in values])


def _same_submissions(a: Term, b: Term, rounds: np.ndarray) -> int | None:
    """The rounds a run needs to tell ``a`` from ``b``, when the two submit the same update in every one of
    ``rounds`` (None: they can differ there)."""
    if a.strategy is None or b.strategy is None or (a.scale, a.absolute) != (b.scale, b.absolute):
        return None
    return first_round_apart(a.strategy, b.strategy, [int(t) for t in rounds])


def _measure_chain(expectation: Expectation, chain: Chain, run: Run) -> RunOutcome:
    rounds = _rounds(expectation, run)
    mean = expectation.over == "mean"
    need = expectation.required_gap
    sign = 1.0 if chain.descending else -1.0
    candidates, breaches, unmeasured = [], [], []
    for a, b in _links(chain, run):
        link = f"{a} {'>' if chain.descending else '<'} {b}"
        # Equal submissions give a gap of exactly 0: a tolerance accepts that tie, a margin (>= 0) cannot be met.
        needs_rounds = _same_submissions(a, b, rounds) if need >= 0 else None
        if needs_rounds is not None:
            unmeasured.append(Unmeasured(link, (int(rounds[0]), int(rounds[-1])), needs_rounds))
            continue
        av, bv = _term_values(a, run, rounds, mean), _term_values(b, run, rounds, mean)
        gap = sign * (av - bv)
        candidates += [(float(g), link if mean else f"round {t}, {link}") for g, t in zip(gap, rounds)]
        for j in np.flatnonzero(~(gap > need)):
            broken: tuple[int, ...] = ()
            if mean:  # the rounds in which this link broke by itself
                per_round = sign * (_term_values(a, run, rounds, False) - _term_values(b, run, rounds, False))
                broken = tuple(int(t) for t in rounds[~(per_round > need)])
            breaches.append(Breach(None if mean else int(rounds[j]), str(a), float(av[j]), str(b), float(bv[j]),
                                   float(gap[j]), broken))
    breaches.sort(key=lambda x: (x.round or 0, x.gap))
    smallest, worst = _smallest(candidates) if candidates else (math.nan, "no link measurable")
    return RunOutcome(run, smallest, not breaches, tuple(breaches), worst, tuple(unmeasured))


def _sign_gap(delta: np.ndarray) -> tuple[float, float, float]:
    """(smallest diagonal entry, largest off-diagonal entry, gap = the smaller of the first and minus the second)."""
    off = delta[~np.eye(len(delta), dtype=bool)]
    low, high = float(np.min(np.diag(delta))), float(np.max(off))
    return low, high, float(np.min([low, -high]))  # NaN propagates


def _measure_categorical(expectation: Expectation, run: Run) -> RunOutcome:
    if run.honest_pairs is None:
        raise InputError(f"{run.path} has no round_records, so no delta matrices to check")
    rounds = _rounds(expectation, run)
    need = expectation.required_gap
    scored = [(t, p) for t in rounds for p in run.honest_pairs[t - 1]]
    if not scored:
        raise InputError(f"{run.path} scored no pair of honest updates in rounds {rounds[0]}-{rounds[-1]}")
    if expectation.over == "mean":
        # Definition 3.1 on the honest pairs' delta averaged over the pairs and rounds.
        items = [(None, "the mean delta of the honest pairs", np.mean([p.delta for _, p in scored], axis=0))]
    else:
        items = [(int(t), f"delta({p.client}, {p.peer})", p.delta) for t, p in scored]
    candidates, breaches = [], []
    for t, label, delta in items:
        low, high, gap = _sign_gap(delta)
        candidates.append((gap, label if t is None else f"round {t}, {label}"))
        if not gap > need:
            breaches.append(Breach(t, f"smallest diagonal entry of {label}", low, "largest off-diagonal entry",
                                   high, gap))
    smallest, worst = _smallest(candidates)
    return RunOutcome(run, smallest, not breaches, tuple(breaches), worst)


def measure(expectation: Expectation, run: Run) -> RunOutcome:
    chain = expectation.chain
    return _measure_categorical(expectation, run) if chain is None else _measure_chain(expectation, chain, run)


def check_runs(expectations: ExpectationSet, runs: Sequence[Run]) -> CheckResult:
    """Every expectation measured on every run, and whether it holds across the runs (seeds)."""
    if not runs:
        raise InputError("no report to check")
    for run in runs:
        require_strategies(expectations, list(run.rewards), str(run.path))
    outcomes = []
    for e in expectations.expect:
        measured = tuple(measure(e, run) for run in runs)
        needs = max((m.needs_rounds for m in measured if m.needs_rounds is not None), default=None)
        if e.seeds == "all":
            held = all(m.holds for m in measured)
            outcomes.append(Outcome(e, measured, held and needs is None, needs_rounds=needs if held else None))
        else:
            gaps = [m.gap for m in measured if not (m.unmeasured and math.isnan(m.gap) and m.holds)]
            q = float(np.quantile(gaps, e.seeds, method="lower")) if gaps else None
            held = q is None or q > e.required_gap
            outcomes.append(Outcome(e, measured, held and needs is None, q, needs_rounds=needs if held else None))
    return CheckResult(expectations.name, tuple(outcomes), tuple(runs))


# ----------------------------------------------------------------------------------------------------------
# Output


def _run_labels(runs: Sequence[Run]) -> list[str]:
    """``seed S``, with the run's folder added where two runs share a seed."""
    seeds = [r.seed for r in runs]
    return [f"seed {r.seed}" if seeds.count(r.seed) == 1 else f"seed {r.seed} ({r.path.parent.name or r.path})"
            for r in runs]


def _breach_text(b: Breach, need: float) -> str:
    where = "mean over rounds" if b.round is None else f"round {b.round}"
    text = (f"{where}: {b.left} = {b.left_value:+.4f}, {b.right} = {b.right_value:+.4f}: gap {b.gap:+.4f} "
            f"is not above the margin {need:+g}")
    if b.round is None:
        text += (f" (broken on its own in round{'s' if len(b.rounds_broken) > 1 else ''} "
                 f"{', '.join(map(str, b.rounds_broken))})" if b.rounds_broken else " (no single round broke it)")
    return text


def _run_verdict(m: RunOutcome) -> str:
    if not m.holds:
        return "broken"
    return "holds" if m.needs_rounds is None else f"not measurable (needs {m.needs_rounds} rounds)"


@dataclass(frozen=True)
class CheckResult:
    name: str
    outcomes: tuple[Outcome, ...]
    runs: tuple[Run, ...]
    labels: list[str] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "labels", _run_labels(self.runs))

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outcomes)

    @property
    def failed(self) -> bool:
        """An expectation broke (not merely unmeasurable on these runs)."""
        return any(o.failed for o in self.outcomes)

    def unmeasured_text(self, outcome: Outcome) -> str:
        """Why an expectation could not be measured on these runs, and the rounds a run needs (each line
        printable on its own, as in ``failure_text``)."""
        from .report import printable

        e = outcome.expectation
        lines = [f"NOT MEASURABLE {e.title}: {e.describe()} is not measurable on this run; it needs a run of at "
                 f"least {outcome.needs_rounds} rounds"]
        seen = {(u.link, u.rounds, u.needs_rounds) for m in outcome.runs for u in m.unmeasured}
        lines += [f"  {link}: both submit the same update (one honest round replayed) in every round "
                  f"{first}-{last}; they differ from round {needs}" for link, (first, last), needs in sorted(seen)]
        return "\n".join(printable(line) for line in lines)

    def failure_text(self, outcome: Outcome) -> str:
        """Where a failed expectation broke: run (seed, report), links, the two values, the gap, the figure.

        Each line is made printable on its own: a newline inside a name from a report (a strategy, a client, a
        folder) is shown as ``\\n``, never starts a line of its own in a CI log."""
        from .report import printable

        e, need = outcome.expectation, outcome.expectation.required_gap
        lines = [f"FAILED {e.title}: {e.describe()}, margin {need:+g}"]
        if outcome.quantile_gap is not None:
            lines.append(f"  the {e.seeds:g}-quantile of the seeds' smallest gaps is {outcome.quantile_gap:+.4f}")
        for label, m in zip(self.labels, outcome.runs):
            if m.holds:
                continue
            lines.append(f"  {label} ({m.run.path}):")
            lines += [f"    {_breach_text(b, need)}" for b in m.breaches[:MAX_LISTED]]
            if len(m.breaches) > MAX_LISTED:
                lines.append(f"    ... and {len(m.breaches) - MAX_LISTED} more")
            figure = m.run.figure
            lines.append(f"    figure: {figure}" + ("" if figure.is_file() else " (not found)"))
        return "\n".join(printable(line) for line in lines)

    def table(self) -> str:
        from .report import text_table  # rich, only when printing

        rows = []
        for k, o in enumerate(self.outcomes, start=1):
            cells = [("n/a" if math.isnan(m.gap) and m.holds and m.unmeasured else f"{m.gap:+.4f}")
                     + ("" if m.holds else " fail") for m in o.runs]
            result = ("pass" if o.passed else "FAIL" if o.failed
                      else f"not measurable: needs {o.needs_rounds} rounds")
            if o.quantile_gap is not None:
                result += f" (q{o.expectation.seeds:g} {o.quantile_gap:+.4f})"
            e = o.expectation
            title = e.describe() if e.name is None else f"{e.name}: {e.describe()}"
            rows.append((str(k), title, *cells,
                         f"{e.required_gap:+g}", result))
        held = sum(o.passed for o in self.outcomes)
        unmeasurable = sum(not o.passed and not o.failed for o in self.outcomes)
        table = text_table(f"kfca-llm check: {self.name} on {len(self.runs)} run(s)",
                           ["#", "expectation", *self.labels, "margin", "result"], rows,
                           ["each value is the run's smallest gap between neighbours of the chain (left minus right "
                            "for '>', right minus left for '<'; the sign margin of delta for categorical-world); it "
                            "must exceed the margin"])
        # Failures unwrapped (CI logs are searched line by line), from report text made printable.
        from .report import printable

        failures = [printable(self.failure_text(o), keep_newlines=True) for o in self.outcomes if o.failed]
        unmeasured = [printable(self.unmeasured_text(o), keep_newlines=True) for o in self.outcomes
                      if not o.passed and not o.failed]
        summary = f"{held}/{len(self.outcomes)} expectations hold"
        if unmeasurable:
            summary += f", {unmeasurable} not measurable on these runs"
        return "\n".join([table, *failures, *unmeasured, summary])

    def junit_xml(self) -> bytes:
        """JUnit XML: one test suite, one test case per expectation (failure text as the runner shows it)."""
        from .report import printable  # XML 1.0 cannot carry control characters; report text may have them

        failures = sum(o.failed for o in self.outcomes)
        skipped = sum(not o.passed and not o.failed for o in self.outcomes)
        suites = ET.Element("testsuites", name="kfca-llm check", tests=str(len(self.outcomes)),
                            failures=str(failures), errors="0", skipped=str(skipped), time="0")
        suite = ET.SubElement(suites, "testsuite", name=printable(f"kfca-llm check: {self.name}"),
                              tests=str(len(self.outcomes)), failures=str(failures), errors="0",
                              skipped=str(skipped), time="0")
        properties = ET.SubElement(suite, "properties")
        for label, run in zip(self.labels, self.runs):
            ET.SubElement(properties, "property", name=printable(label), value=printable(str(run.path)))
        for o in self.outcomes:
            case = ET.SubElement(suite, "testcase", classname=printable(f"kfca-llm.check.{self.name}"),
                                 name=printable(o.expectation.title), time="0")
            if o.failed:
                text = self.failure_text(o)
                failure = ET.SubElement(case, "failure", type="ExpectationFailed",
                                        message=printable(text.splitlines()[0]))
                failure.text = printable(text, keep_newlines=True)
            elif not o.passed:
                text = self.unmeasured_text(o)
                ET.SubElement(case, "skipped", message=printable(text.splitlines()[0])).text = printable(
                    text, keep_newlines=True)
            out = ET.SubElement(case, "system-out")
            out.text = "\n".join(printable(
                f"{label}: smallest gap {m.gap:+.4f} ({m.worst}), margin {o.expectation.required_gap:+g}: "
                f"{_run_verdict(m)}") for label, m in zip(self.labels, o.runs))
        ET.indent(suites)
        return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"
