"""Check a federation's rewards against expectations (the work of ``kfca-llm check``).

``check_reports.load_runs`` reads the runs, ``check_runs`` measures every expectation on every run, and the
``CheckResult`` (``check_result.py``) prints the table and the failures, and writes JUnit XML. A link ``a > b``
of a chain has the *gap* ``a - b`` (``b - a`` for ``<``); an expectation holds on a run when its smallest gap,
over links (and rounds, for ``every-round``), exceeds the margin. A link between two strategies that submit the
same update in every round read (``lagged:2`` and ``stale`` replay round 1's until round 3) is not measurable on
that run unless a tolerance lets them tie: the check names the rounds a run needs instead of reporting a failure.

A margin or tolerance ``K x STRATEGY`` is K times the magnitude of the run's mean reward of that strategy over the
rounds read (``Expectation.gap_needed``). Rounds in which both strategies of a link were paid as copies of
another participant's earlier submissions under the duplicate policy (``copy_rounds`` less
``own_resubmission_rounds`` in report.json; the peer pool scores a replay of the analysis client's own update
without the pool, on the round's peers, so those rounds keep the scoring rule's order of lags and are read) are
left out of that link: the policy paid both nothing. A link with no round left is a tie under a tolerance and not
measurable under a margin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .attacks import first_round_apart
from .check_reports import Run
from .check_result import Breach, CheckResult, Outcome, RunOutcome, Unmeasured
from .errors import InputError
from .expectations import Chain, Expectation, ExpectationSet, Term
from .text import listed


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
    named = {s: None for e in expectations.expect
             for s in (*(e.chain.named if e.chain is not None else ()), *filter(None, [e.scale_strategy]))}
    missing = [s for s in named if s not in strategies]
    if missing:
        import difflib

        close = {c for s in missing for c in difflib.get_close_matches(s, strategies, n=2)}
        hint = f" (close: {', '.join(sorted(close))})" if close else ""
        raise InputError(f"{where} has no strategy {listed([repr(s) for s in missing])}{hint}; its strategies: "
                         f"{listed(strategies, limit=20)} (kfca.attacks or --attacks lists what a run analyses)")


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


def _need(expectation: Expectation, run: Run, rounds: np.ndarray) -> float:
    """The gap every link must exceed on ``run`` (a relative margin on its mean reward over ``rounds``)."""
    return expectation.gap_needed(lambda strategy: float(run.rewards[strategy][rounds - 1].mean()))


def _both_copies(a: Term, b: Term, run: Run, rounds: np.ndarray) -> np.ndarray:
    """Per round of ``rounds``: both terms are strategies paid as copies of earlier submissions in that round."""
    if a.strategy is None or b.strategy is None:
        return np.zeros(len(rounds), dtype=bool)
    both = run.copies.get(a.strategy, frozenset()) & run.copies.get(b.strategy, frozenset())
    return np.isin(rounds, sorted(both))


def _measure_chain(expectation: Expectation, chain: Chain, run: Run) -> RunOutcome:
    read = _rounds(expectation, run)
    mean = expectation.over == "mean"
    need = _need(expectation, run, read)
    sign = 1.0 if chain.descending else -1.0
    candidates, breaches, unmeasured = [], [], []
    for a, b in _links(chain, run):
        link = f"{a} {'>' if chain.descending else '<'} {b}"
        rounds = read[~_both_copies(a, b, run, read)]
        if not len(rounds):  # a tie the duplicate policy made: a tolerance accepts it, a margin cannot be met
            if need >= 0:
                unmeasured.append(Unmeasured(link, (int(read[0]), int(read[-1])), None))
            else:
                candidates.append((0.0, f"{link} (both paid as copies)"))
            continue
        # Equal submissions give a gap of exactly 0: a tolerance accepts that tie, a margin (>= 0) cannot be met.
        needs_rounds = _same_submissions(a, b, rounds) if need >= 0 else None
        if needs_rounds is not None:
            copied = len(rounds) < len(read)
            unmeasured.append(Unmeasured(link, (int(read[0]), int(read[-1])), None if copied else needs_rounds))
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
    return RunOutcome(run, smallest, not breaches, tuple(breaches), worst, tuple(unmeasured), need)


def _sign_gap(delta: np.ndarray) -> tuple[float, float, float]:
    """(smallest diagonal entry, largest off-diagonal entry, gap = the smaller of the first and minus the second)."""
    off = delta[~np.eye(len(delta), dtype=bool)]
    low, high = float(np.min(np.diag(delta))), float(np.max(off))
    return low, high, float(np.min([low, -high]))  # NaN propagates


def _measure_categorical(expectation: Expectation, run: Run) -> RunOutcome:
    if run.honest_pairs is None:
        raise InputError(f"{run.path} has no round_records, so no delta matrices to check")
    rounds = _rounds(expectation, run)
    need = _need(expectation, run, rounds)
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
    return RunOutcome(run, smallest, not breaches, tuple(breaches), worst, need=need)


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
        unmeasured = any(m.unmeasured for m in measured)
        q = None
        if e.seeds == "all":
            held = all(m.holds for m in measured)
        else:
            # The q-quantile run by its gap over its own need (a relative margin differs between runs).
            # A NaN gap never holds, whatever the quantile.
            scored = sorted((m for m in measured if not (m.unmeasured and math.isnan(m.gap) and m.holds)),
                            key=lambda m: (not math.isnan(m.gap - m.need), m.gap - m.need))
            index = 0 if scored and math.isnan(scored[0].gap - scored[0].need) else (
                int(np.quantile(np.arange(len(scored)), e.seeds, method="lower")) if scored else None)
            pick = None if index is None else scored[index]
            q = None if pick is None else pick.gap
            held = pick is None or pick.gap > pick.need
        outcomes.append(Outcome(e, measured, held and not unmeasured, q, needs_rounds=needs if held else None,
                                unmeasurable=held and unmeasured))
    return CheckResult(expectations.name, tuple(outcomes), tuple(runs))
