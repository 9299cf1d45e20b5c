"""The peer pool a ledger's run had, rebuilt round by round from the rows and the kept words (``verify`` and a
resumed ``KFCAStrategy`` alike): each round closed by ``fl.pool_close.close_round``, the function the live run closed
it with, from what its rows record (``closing_from_rows``: a translation, no rule of its own), and the settlements
each round recorded scored again."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..engine.duplicates import DuplicateRule
from ..errors import InputError
from ..report import printable
from .ledger_rows import SCORED, RewardRow, RoundRow, SettlementRow


CLOSES_RUN = "closes_run"
"""The key of a round's recorded settings that marks its run's last round, which settles every participant still
waiting that its pool determines (pool rule 17, ``fl.pool_settle``): ``true`` there, absent elsewhere."""


def closes_run(settings: Mapping[str, Any]) -> bool:
    """Whether a round's recorded settings mark it its run's last round (``CLOSES_RUN``); ``Unverifiable`` where the
    key holds anything but true or false."""
    value = settings.get(CLOSES_RUN, False)
    if not isinstance(value, bool):
        raise Unverifiable(f"the round's {CLOSES_RUN} setting is {printable(repr(value))[:40]}, not true or false")
    return value


class Unverifiable(Exception):
    """What a round needs to be scored again is not there (or not readable by this version): not a mismatch."""


class Damaged(Exception):
    """The round says its signs were kept, and what the store holds cannot be them."""


def recorded_planes(round_row: RoundRow, read_words) -> Any:
    """The public strata's planes (``engine.public.PublicPlanes``) a round was scored within, read from the store by
    ``read_words(sha, rows)`` (None: unconditioned); ``Damaged`` / ``Unverifiable`` when they cannot be."""
    from ..engine.public import PublicConditioning, PublicPlanes

    if round_row.public_sha256 is None:
        if round_row.public_steps is not None:
            raise Damaged("the round records public steps without their planes")
        return None
    try:
        recorded = round_row.settings["public"]
        conditioning = PublicConditioning(int(recorded["steps"]), int(recorded["magnitude_buckets"]))
    except (KeyError, TypeError, ValueError) as exc:  # InputError among them
        raise Unverifiable(f"the round's public strata were recorded without settings this version reads ({exc})"
                            ) from None
    steps = round_row.public_steps
    if steps is None or not 1 <= steps <= conditioning.steps:
        raise Damaged(f"the round records {steps!r} public steps; its settings allow 1 to {conditioning.steps}")
    spans = round_row.public_spans  # None: recorded before the spans were (doubling spans)
    if spans is not None and (len(spans) != steps or list(spans) != sorted(set(spans))):
        raise Damaged(f"the round records the spans {list(spans)} for {steps} public sign planes")
    n_planes = steps + conditioning.magnitude_bits
    words = np.ascontiguousarray(read_words(round_row.public_sha256, n_planes), dtype=np.int32)
    return PublicPlanes(words.reshape(n_planes, -1), steps, conditioning.magnitude_bits, tuple(spans or ()))


def recorded_values(round_row: RoundRow | None, participants: Sequence[str], read_words) -> dict[str, np.ndarray]:
    """Participant -> the value sketch its round recorded (``RoundRow.values_sha256``: ``valid_replies`` sketches
    stored as ``fl.pool_values.sketches_bytes``, read by ``read_words(sha, size=)``); empty where the round recorded
    none (its own replays were judged on the signs alone then). A participant its round holds no sketch of has none."""
    from ..engine.layout import Layout
    from ..fl.pool_values import sketches_from_bytes, sketches_size, value_samples

    if round_row is None or round_row.values_sha256 is None or round_row.layout is None:
        return {}
    samples = value_samples(Layout.from_shapes(dict(round_row.layout)))
    size = sketches_size(round_row.valid_replies, samples)
    data = np.ascontiguousarray(read_words(round_row.values_sha256, size=size)).tobytes()
    try:
        return sketches_from_bytes(data, participants, round_row.valid_replies, samples)
    except ValueError as exc:
        raise Damaged(f"the round's value sketches: {exc}") from None


class _StoredWords(Mapping):
    """Participant -> its kept sign words, read from the store on first access (by participant, sorted)."""

    def __init__(self, rows: Sequence[RewardRow], read_words):
        self._sha = {r.participant: r.sign_sha256 for r in sorted(rows, key=lambda r: r.participant)}
        self._read, self._words = read_words, {}

    def __getitem__(self, participant: str) -> np.ndarray:
        if participant not in self._words:
            self._words[participant] = np.ascontiguousarray(self._read(self._sha[participant]), dtype=np.int32)
        return self._words[participant]

    def __iter__(self):
        return iter(self._sha)

    def __len__(self) -> int:
        return len(self._sha)


def closing_from_rows(t: int, round_row: RoundRow | None, rows: Sequence[RewardRow],
                      run_settings: Mapping[str, Any], settlements: Sequence[SettlementRow], read_words) -> Any:
    """The ``fl.pool_close.ClosingRound`` round ``t``'s ledger rows record, to close it as the live run did: who was
    scored, their copy groups, scores and payments, who went unpaid (``RoundRow.undetermined``) and the settlements
    the round made. A round row missing (or recorded without a layout, or not scored): nobody waits, and its
    duplicate policy is the run's."""
    from ..fl.pool_close import ClosingRound
    from ..fl.pool_settle import PendingRound, Settlement

    settings = run_settings if round_row is None else round_row.settings
    waits = round_row is not None and round_row.status == SCORED and round_row.layout is not None

    def pending() -> PendingRound:
        return PendingRound(t, round_row.seed, tuple(round_row.layout), {},
                            np.ascontiguousarray(read_words(round_row.task_sha256), dtype=np.int32), (), (),
                            settings["penalty"], float(settings["bonus_fraction"]), settings["duplicates"],
                            DuplicateRule(**settings["duplicate_rule"]), planes=recorded_planes(round_row, read_words))

    return ClosingRound(t, tuple(r.participant for r in rows), _StoredWords(rows, read_words),
                        {r.participant: r.duplicate_group for r in rows if r.duplicate_group is not None},
                        {r.participant: r.unadjusted_reward for r in rows}, {r.participant: r.reward for r in rows},
                        tuple(round_row.undetermined or ()) if waits else (), {r.participant: r.peers for r in rows},
                        settings.get("duplicates"), pending, values=recorded_values(
                            round_row, [r.participant for r in rows], read_words) if waits else {},
                        settlements=[Settlement(r.round, r.settled_in, r.participant, r.reward, r.unadjusted_reward,
                                                tuple(r.peers)) for r in settlements],
                        closes_run=round_row is not None and closes_run(round_row.settings))


class PoolTracker:
    """Each run's peer pool as ``verify_ledger`` walks the rounds in commit order, and as a resumed ``KFCAStrategy``
    rebuilds it: built once, round by round, from the rounds' kept signs (each round closed as the live run closed it,
    with the settlements it recorded), so a run of T rounds reads each file once."""

    def __init__(self, by_round: Mapping[tuple[str, int], Sequence[RewardRow]],
                 rounds: Mapping[tuple[str, int], RoundRow] | None = None,
                 settlements: Mapping[tuple[str, int], Sequence[SettlementRow]] | None = None):
        self._by_round = by_round
        self._rounds = rounds or {}
        self._settled = settlements or {}
        self._pools: dict[str, tuple[Any, int]] = {}
        self._broken: dict[str, str] = {}

    @classmethod
    def of(cls, contents, run: str | None = None) -> PoolTracker:
        """The tracker of a ledger's rows (``read_ledger``'s ``LedgerContents``), of one run's alone when ``run`` is
        given."""
        def mine(row) -> bool:
            return run is None or row.run_id == run

        by_round: dict[tuple[str, int], list[RewardRow]] = {}
        for row in filter(mine, contents.rewards):
            by_round.setdefault((row.run_id, row.round), []).append(row)
        settled: dict[tuple[str, int], list[SettlementRow]] = {}
        for row in filter(mine, contents.settlements):
            settled.setdefault((row.run_id, row.settled_in), []).append(row)
        return cls(by_round, {(r.run_id, r.round): r for r in filter(mine, contents.rounds)}, settled)

    def rows(self, round_row: RoundRow) -> Sequence[RewardRow]:
        """The reward rows of ``round_row``'s round."""
        return self._by_round.get((round_row.run_id, round_row.round), [])

    def before(self, round_row: RoundRow, read_words) -> Any:
        """The pool ``round_row``'s run had before it (None: scored without one); ``Unverifiable`` when an earlier
        round's signs cannot be read."""
        if "pool" not in round_row.settings:
            return None
        return self._advance(round_row.run_id, round_row.settings, round_row.round - 1, read_words)[0]

    def rebuilt(self, run: str, settings: Mapping[str, Any], last_round: int, read_words) -> Any:
        """The pool a run recorded with ``settings`` had after ``last_round`` (a resumed ``KFCAStrategy`` goes on with
        it); ``InputError`` when it cannot be rebuilt."""
        from ..fl.peer_pool import PeerPool, recorded_pool_settings

        if last_round < 1:
            return PeerPool(recorded_pool_settings(settings["pool"]))
        try:
            return self._advance(run, settings, last_round, read_words)[0]
        except Unverifiable as exc:
            raise InputError(str(exc)) from None

    def settled_in(self, round_row: RoundRow) -> int:
        return len(self._settled.get((round_row.run_id, round_row.round), []))

    def check_settlements(self, round_row: RoundRow, read_words) -> list[str]:
        """The settlements ``round_row`` recorded, each scored again on the pool as it stood after the round was added
        (before any of them applied): one line per row that differs."""
        rows = self._settled.get((round_row.run_id, round_row.round), [])
        if not rows:
            return []
        if "pool" not in round_row.settings:
            return [f"{len(rows)} settlement(s) in a round scored without a peer pool"]
        self.before(round_row, read_words)
        return self._advance(round_row.run_id, round_row.settings, round_row.round, read_words, check=rows)[1]

    def _advance(self, run: str, settings: Mapping[str, Any], upto: int, read_words,
                 check: Sequence[SettlementRow] = ()) -> tuple[Any, list[str]]:
        """(the run's pool after round ``upto``, the mismatches of ``check``: round ``upto``'s settlements scored again
        on the pool as it stood after that round was added, before they applied)."""
        from ..fl.peer_pool import PeerPool, recorded_pool_settings
        from ..fl.pool_close import close_round

        if run in self._broken:
            raise Unverifiable(self._broken[run])
        try:
            pool, done = self._pools.get(run) or (PeerPool(recorded_pool_settings(settings["pool"])), 1)
        except (TypeError, AttributeError, InputError) as exc:
            raise Unverifiable(f"this version cannot rebuild the round's peer pool ({exc})") from None
        if check and done > upto:
            raise Unverifiable(f"round {upto}'s settlements were applied before the round was checked (its row comes "
                                "after a later round's: rows reordered)")
        mismatches: list[str] = []
        try:
            for t in range(done, upto + 1):
                closing = closing_from_rows(t, self._rounds.get((run, t)), self._by_round.get((run, t), []), settings,
                                            self._settled.get((run, t), []), read_words)

                def check_settlements(at_pool, closes=closing.closes_run) -> None:  # round upto's, before they apply
                    mismatches.extend(_settlement_mismatches(at_pool, upto, check, closes))

                close_round(pool, closing, check_settlements if check and t == upto else None)
        except (Damaged, Unverifiable, InputError, KeyError, TypeError, ValueError) as exc:
            self._broken[run] = f"its peer pool cannot be rebuilt: an earlier round's signs or records ({exc})"
            raise Unverifiable(self._broken[run]) from None
        self._pools[run] = (pool, max(done, upto + 1))
        return pool, mismatches


def _settlement_mismatches(pool, horizon: int, rows: Sequence[SettlementRow], closes: bool) -> list[str]:
    from ..fl.pool_settle import score_pending, settles

    out = []
    for row in rows:
        pending = pool.pending.get(row.round)
        if pending is None or row.participant not in pending.waiting or row.round == horizon and not closes:
            out.append(f"{row.participant}: settlement of round {row.round} at round {horizon}, which was not waiting "
                       f"to be settled then")
            continue
        pooled = score_pending(pool, pending, horizon)
        if row.participant not in settles(pool, pending, pooled, horizon, closes):
            out.append(f"{row.participant}: round {row.round} settled at round {horizon}, where the pool could not "
                       f"settle it yet")
            continue
        report = pooled.report
        expected = (report.rewards[row.participant], report.unadjusted_rewards[row.participant],
                    tuple(report.peers[row.participant]))
        stored = (row.reward, row.unadjusted_reward, tuple(row.peers))
        if expected != stored:
            names = ("reward", "unadjusted_reward", "peers")
            out.append(f"{row.participant} (round {row.round}, settled): " + ", ".join(
                f"{n} {s!r} (recomputed {e!r})" for n, s, e in zip(names, stored, expected) if s != e))
    return out
