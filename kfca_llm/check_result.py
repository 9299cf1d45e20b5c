"""The result of ``kfca-llm check``: per expectation and run, the smallest gap, the breaches and the links that
could not be measured; printed as a table with the failures (each line printable on its own, for CI logs
searched line by line) and written as JUnit XML.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field

from .check_reports import Run
from .expectations import Expectation

MAX_LISTED = 8  # breaches listed per run in a failure (the rest are counted)


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
    """A link whose gap is 0 by construction, not a measurement, in every round the check reads: the two strategies
    submit the same update (``lagged:2`` and ``stale`` replay round 1's in rounds 1-3), or both are paid as copies
    of earlier submissions (the peer pool pays every replay of the analysis client's own updates as a copy)."""

    link: str
    rounds: tuple[int, int]
    """The first and last round read."""
    needs_rounds: int | None
    """The rounds a run needs for the two to submit different updates (None: both were paid as copies in every
    round read that they did not submit the same update; no longer run changes that)."""

    def text(self) -> str:
        first, last = self.rounds
        if self.needs_rounds is not None:
            return (f"{self.link}: both submit the same update (one honest round replayed) in every round "
                    f"{first}-{last}; they differ from round {self.needs_rounds}")
        return (f"{self.link}: in every round {first}-{last} both submit the same update or both are paid as copies "
                "of earlier submissions (the peer pool's copy detection, under kfca.duplicates): no order to measure")


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
    need: float = 0.0
    """What every gap had to exceed on this run: the margin, or minus the tolerance (a relative one, ``K x
    STRATEGY``, on this run's mean reward of the strategy)."""

    @property
    def needs_rounds(self) -> int | None:
        """The rounds a run needs to measure every link (None: this one measured them all, or no run length helps)."""
        return max((u.needs_rounds for u in self.unmeasured if u.needs_rounds is not None), default=None)


@dataclass(frozen=True)
class Outcome:
    expectation: Expectation
    runs: tuple[RunOutcome, ...]
    passed: bool
    quantile_gap: float | None = None
    """With ``seeds = q``: the q-quantile of the runs' gaps (numpy's 'lower': one run's own gap)."""
    needs_rounds: int | None = None
    """Set when nothing measured broke but a link could not be measured: the rounds a run needs."""
    unmeasurable: bool = False
    """Nothing measured broke but a link could not be measured (``needs_rounds``, or copies on every round)."""

    @property
    def failed(self) -> bool:
        return not self.passed and not self.unmeasurable

    def verdict(self) -> str:
        if self.passed:
            return "pass"
        if self.failed:
            return "FAIL"
        return "not measurable: " + (f"needs {self.needs_rounds} rounds" if self.needs_rounds is not None
                                     else "both paid as copies")


def _run_labels(runs: Sequence[Run]) -> list[str]:
    """``seed S``, with the run's folder added where two runs share a seed."""
    seeds = [r.seed for r in runs]
    return [f"seed {r.seed}" if seeds.count(r.seed) == 1 else f"seed {r.seed} ({r.path.parent.name or r.path})"
            for r in runs]


def _margin_of_run(e: Expectation, need: float) -> str:
    """The margin as a failure names it: ``+0.02``, or ``0.1 x honest = +0.0050`` for a relative one."""
    return f"{need:+g}" if e.scale_strategy is None else f"{e.margin_text()} = {need:+.4f}"


def _breach_text(b: Breach, margin: str) -> str:
    where = "mean over rounds" if b.round is None else f"round {b.round}"
    text = (f"{where}: {b.left} = {b.left_value:+.4f}, {b.right} = {b.right_value:+.4f}: gap {b.gap:+.4f} "
            f"is not above the margin {margin}")
    if b.round is None:
        text += (f" (broken on its own in round{'s' if len(b.rounds_broken) > 1 else ''} "
                 f"{', '.join(map(str, b.rounds_broken))})" if b.rounds_broken else " (no single round broke it)")
    return text


def _run_verdict(m: RunOutcome) -> str:
    if not m.holds:
        return "broken"
    if not m.unmeasured:
        return "holds"
    return "not measurable (" + (f"needs {m.needs_rounds} rounds)" if m.needs_rounds is not None
                                 else "both paid as copies)")


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
        why = (f"it needs a run of at least {outcome.needs_rounds} rounds" if outcome.needs_rounds is not None
               else "no run length changes that")
        lines = [f"NOT MEASURABLE {e.title}: {e.describe()} is not measurable on this run; {why}"]
        seen = {u.text() for m in outcome.runs for u in m.unmeasured}
        lines += [f"  {text}" for text in sorted(seen)]
        return "\n".join(printable(line) for line in lines)

    def failure_text(self, outcome: Outcome) -> str:
        """Where a failed expectation broke: run (seed, report), links, the two values, the gap, the figure.

        Each line is made printable on its own: a newline inside a name from a report (a strategy, a client, a
        folder) is shown as ``\\n``, never starts a line of its own in a CI log."""
        from .report import printable

        e = outcome.expectation
        lines = [f"FAILED {e.title}: {e.describe()}, margin {e.margin_text()}"]
        if outcome.quantile_gap is not None:
            lines.append(f"  the {e.seeds:g}-quantile of the seeds' smallest gaps is {outcome.quantile_gap:+.4f}")
        for label, m in zip(self.labels, outcome.runs):
            if m.holds:
                continue
            lines.append(f"  {label} ({m.run.path}):")
            lines += [f"    {_breach_text(b, _margin_of_run(e, m.need))}" for b in m.breaches[:MAX_LISTED]]
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
            result = o.verdict()
            if o.quantile_gap is not None:
                result += f" (q{o.expectation.seeds:g} {o.quantile_gap:+.4f})"
            e = o.expectation
            title = e.describe() if e.name is None else f"{e.name}: {e.describe()}"
            rows.append((str(k), title, *cells, e.margin_text(), result))
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
                f"{label}: smallest gap {m.gap:+.4f} ({m.worst}), margin {_margin_of_run(o.expectation, m.need)}: "
                f"{_run_verdict(m)}") for label, m in zip(self.labels, o.runs))
        ET.indent(suites)
        return ET.tostring(suites, encoding="utf-8", xml_declaration=True) + b"\n"
