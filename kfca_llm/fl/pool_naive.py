"""A naive reference of the peer pool at two participants per round: slow, short, from plain lists.

``naive_run`` pays a run of rounds of two participants each as ``fl.peer_pool.score_with_pool`` and
``fl.pool_close.close_round`` do (``PoolSettings`` defaults but the window, the rank rule and the own-replay limit;
penalty "expected", duplicate policy "zero"), written as directly as the rules read in docs/few-peers.md, so that a
test can hold the real implementation to it (``tests/test_pool_naive.py``). Covered: the pool (which entries, vetted by
their round's score; sign words kept for the window and one round more), the signed lag weights, the pool's verdict,
the in-round peer read the way verdict plus record say (or, with ``rank_by="verdict-first"``, by the verdicts alone
where they differ by more than two standard errors; with ``"reputation"``, by the mean of tanh(verdict / its standard
error), this round's and the participant's earlier ones, 0.8 times the weight a participation older, a negative one
twice as much), the record (a Beta reputation of the run's scores: (good + 1) / (good + 2 bad + 2) - 1/2, a score
<= 0 bad, submissions charged back left out),
public strata (each round's pairs scored within its strata, a disagreeing pair ranked on the lower of the verdicts
within and without them, or on the verdicts without them alone where the lower of those is below 0 and they differ by
more than two standard errors; else, where one of the two has turned by its own lineage and the other has not, the
turned one lower; a participant that turned by reversing its previous submission paid at most 0, what its last three
submissions since its last turn were paid charged back once; an agreeing pair read back for a scorer whose verdict
without the strata is more than two standard errors below 0 where its peer has turned), undetermined participants (paid
0: too few distinct peers, or the pool alone with its verdict within two standard errors of 0, or a disagreeing pair
nothing above settles, which waits for the round after it), their settlement by a later round (the pool on both
sides, once warm or at the window's last round, or at the run's last round, its own included; a settled entry
rescored; a waiting pair ranked on each one's mean payment against the next round's other participants where two or
more of them agree with each other, or, where two of them disagree, against the one of them the rounds after rank
higher, the pair not settled before those rounds come; a participant of a pair judged on the way no judge, and judges
beside one ranking it higher ranking nothing), in-round copies
(the two participants within 2% of each other's signs: paid at most 0, neither joins the pool), copies of another
participant's earlier submission (within 2% of the signs, on every sign in the window and on the 4,096-bit
sketch beyond it: paid at most 0), own resubmissions (within ``own_replay_limit`` of the signs, and under a limit of 0
the same value at each of the 1,024 sampled coordinates too: scored without the pool, paid at most 0, what the earlier
submission was paid charged back once), the trusted reference (a peer of every
scorer at ``reference_weight``; a round with it is never undetermined) and the attack analysis' owned scorers
(side-by-side submissions of a participant: its pool peers, checked for copies, never pool entries, never charged back,
ranked on their verdict alone, settled as their owner's round is).

A submission is a list of floats (one tensor); its report on a coordinate is whether it is negative; the round's tasks
are the coordinates some submission of the round is non-zero at (the owned scorers' included, never the reference's);
the bonus / penalty partition of the tasks is ``partition.partition_classes`` (the seeded hash that defines it).

This module runs the rounds and settles what waits; one round's scoring (``score``, ``Entry``, ``Scored``, ``sketched``)
is ``fl.pool_naive_round``. The tests: ``tests/test_pool_naive.py`` and ``tests/test_pool_naive_copies.py``.
"""

from __future__ import annotations

from .pool_naive_round import Entry, score

VALUE_SAMPLES = 1024


def sampled(update: list[float]) -> list[float]:
    """The values at the coordinates a value sketch samples: ``floor(j * length / samples)`` for each sample ``j``,
    ``samples`` the length or 1,024, whichever is less."""
    samples = min(VALUE_SAMPLES, len(update))
    return [update[j * len(update) // samples] for j in range(samples)]


def naive_run(rounds: list[dict[str, list[float]]], seeds: list[int], window: int = 10, pool_peers: int = 8,
              pool_weight: float = 0.5, min_peers: int = 2, max_copy: float = 0.02, rank_by: str = "record",
              own_replay_limit: float = 0.0, owners: list[dict[str, str]] | None = None,
              references: list[list[float] | None] | None = None, reference_weight: float = 4.0,
              strata: list[list[int] | None] | None = None, next_round: bool = True,
              closes_run: bool = True) -> list[dict[str, float]]:
    """What each scorer of each round (round t = index + 1, seeded ``seeds[t - 1]``) is paid for it, in its round or,
    undetermined there, by the later round that settled it. ``owners[t - 1]``: the round's attack-analysis scorers
    (-> the participant each is a side-by-side submission of; the round's other two submitters are its participants);
    ``references[t - 1]``: the round's trusted reference update (None: none); ``strata[t - 1]``: each coordinate's
    public stratum in round t (None: the round is not conditioned); ``next_round``: ``PoolSettings.next_round`` (rule
    15); ``closes_run``: the last round is the run's, the last chance of every round still waiting (rule 17)."""
    rules = dict(window=window, pool_peers=pool_peers, pool_weight=pool_weight, min_peers=min_peers, max_copy=max_copy,
                 rank_by=rank_by, own_replay_limit=own_replay_limit, reference_weight=reference_weight,
                 next_round=next_round)

    def round_of(r: int):
        submissions, reference = rounds[r - 1], (references or [None] * r)[r - 1]
        negative = {c: [v < 0 for v in u] for c, u in submissions.items()}
        length = len(next(iter(submissions.values())))
        tasks = [k for k in range(length) if any(u[k] != 0 for u in submissions.values())]
        reference = None if reference is None or reference_weight == 0 else [v < 0 for v in reference]
        return negative, (owners or [{}] * r)[r - 1], tasks, seeds[r - 1], reference, (strata or [None] * r)[r - 1]

    def values_of(r: int) -> dict[str, list[float]]:
        return {c: sampled(u) for c, u in rounds[r - 1].items()}

    history: list[Entry] = []
    pending: dict[int, list[str]] = {}  # round -> its scorers still waiting to be settled
    out = []
    for t in range(1, len(rounds) + 1):
        negative, owned, *_ = this = round_of(t)
        result = score(t, *this, history, horizon=None, values=values_of(t), **rules)
        for c in sorted(negative):
            if c not in owned and c not in result.copies:
                history.append(Entry(t, c, negative[c], result.scores[c], result.paid[c], result.evidence.get(c),
                                     values=values_of(t)[c]))
        for e in result.resubmitted + result.forfeited:
            e.paid, e.charged = min(e.paid, 0.0), True
        if result.unsure:
            pending[t] = sorted(result.unsure)
        out.append(dict(result.paid))
        # Settle what the pool now can: every pending round scored on the pool as it stands, then applied; at the
        # run's last round, whatever it determines, its own round's too.
        closing = closes_run and t == len(rounds)
        settled = {}
        for r in sorted(pending):
            if r < t or closing:
                again = score(r, *round_of(r), history, horizon=t, values=values_of(r), **rules)
                last = closing or t - r >= window
                settled[r] = {c: again for c in pending[r]
                              if c not in again.unsure and (last or c not in again.warming)}
        for r, done in settled.items():
            for c, again in done.items():
                for entry in (e for e in history if (e.round, e.client) == (r, c)):  # none for a copy or owned scorer
                    entry.score, entry.paid = again.scores[c], again.paid[c]
                out[r - 1][c] = again.paid[c]
            pending[r] = [c for c in pending[r] if c not in done]
            if not pending[r] or t - r >= window or closing:
                del pending[r]
    return out
