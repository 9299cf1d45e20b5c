"""Capture a Flower run's scored rounds and pay them again under another pool setting.

``flower_few_peers.py --capture run.npz`` saves what ``KFCAStrategy`` scored each round (the participants' packed
sign words and value sketches, the task words, the public strata's planes, the seed, the pool's settings, each
participant's partition). Under the strategy's default aggregation (``all``: every valid reply reaches FedAvg) the global model,
and so every update, does not depend on the rewards: scoring the captured rounds again with another ranking is what
the same Flower run would have paid under it, on the same nodes and draws. Comparing rules on captured runs takes
seconds a run instead of minutes, and every rule meets the same pairs.

    .venv/bin/python benchmarks/flower_capture.py run1.npz run2.npz --set rank_by=verdict --out-dir /tmp/replayed

writes, per capture, the JSON ``flower_few_peers.py --out`` writes (rounds, rewards by partition, undetermined,
settled, resubmitted), and prints the done-when table of ``flower_few_peers.summarise``. With the capture's own
settings the replay equals the live run bit for bit (checked by ``--check LIVE.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from kfca_llm.engine.duplicates import DuplicateRule
from kfca_llm.engine.public import PublicPlanes
from kfca_llm.fl.peer_pool import PeerPool, score_with_pool
from kfca_llm.fl.pool_close import ClosingRound, close_round
from kfca_llm.fl.pool_store import PoolSettings
from kfca_llm.packer import SignPacker

from flower_few_peers import config_value, rounds_by_partition, summarise  # this folder: on the path as a script


class Capture:
    """Wraps the strategy module's ``score_round``: every call's inputs (as words) kept in memory until ``save``."""

    def __init__(self, score_round):
        self._score_round = score_round
        self.rounds: list[dict] = []
        self.arrays: dict[str, np.ndarray] = {}
        self.settings: dict | None = None

    def __call__(self, packer, pool, server_round, **kwargs):
        scored = self._score_round(packer, pool, server_round, **kwargs)
        signs, task = packer.words()
        k = len(self.rounds)
        for row, client in enumerate(packer.clients):
            self.arrays[f"{k}.signs.{client}"] = np.array(signs[row], dtype=np.int32)
        self.arrays[f"{k}.task"] = np.array(task, dtype=np.int32)
        for client, sketch in (kwargs.get("values") or {}).items():
            self.arrays[f"{k}.values.{client}"] = np.array(sketch, dtype=np.float64)
        planes = scored.pooled.planes
        if planes is not None:
            self.arrays[f"{k}.planes"] = planes.host_words().copy()
        self.settings = pool.settings.to_dict()
        rule = kwargs["duplicate_rule"]
        self.rounds.append({
            "round": server_round, "clients": list(packer.clients),
            "shapes": [[slot.name, list(slot.shape)] for slot in packer.layout.slots],
            "peers": kwargs["peers"], "seed": kwargs["seed"], "penalty": kwargs["penalty"],
            "bonus_fraction": kwargs["bonus_fraction"], "duplicates": kwargs["duplicates"],
            "duplicate_rule": dataclasses.asdict(rule),
            "planes": None if planes is None else [planes.steps, planes.magnitude_bits, list(planes.spans)],
            "closes_run": bool(kwargs.get("closes_run", False))})
        return scored

    def save(self, path: Path, partition_of: dict[int, dict[str, int]], attacks: dict[str, str]) -> None:
        meta = {"rounds": self.rounds, "settings": self.settings, "attacks": attacks,
                "partition_of": {str(t): who for t, who in partition_of.items()}}
        np.savez_compressed(path, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **self.arrays)


def replay(path: Path, overrides: dict, close_last: bool = False) -> dict:
    """The capture at ``path`` paid again with its pool settings changed by ``overrides``: the JSON
    ``flower_few_peers.py --out`` writes (``args`` holds the overrides). The round the live run closed with (pool rule
    17) closes the replay; ``close_last``: the last captured round does, in a capture of a version before the rule."""
    data = np.load(path)
    meta = json.loads(bytes(data["__meta__"]).decode())
    # The rule this version computes, whichever the capture was scored under.
    settings = {**{k: v for k, v in meta["settings"].items() if k != "rule"}, **overrides}
    pool = PeerPool(PoolSettings(**settings))
    rewards, undetermined, resubmitted, forfeited, settlements = {}, {}, {}, {}, []
    for k, r in enumerate(meta["rounds"]):
        words = {c: data[f"{k}.signs.{c}"] for c in r["clients"]}
        packer = SignPacker.from_words({n: tuple(s) for n, s in r["shapes"]}, words, data[f"{k}.task"])
        planes = None if r["planes"] is None else PublicPlanes(data[f"{k}.planes"], r["planes"][0], r["planes"][1],
                                                               tuple(r["planes"][2]))
        common = dict(seed=r["seed"], penalty=r["penalty"], bonus_fraction=r["bonus_fraction"],
                      duplicates=r["duplicates"], duplicate_rule=DuplicateRule(**r["duplicate_rule"]))
        # A capture of a version before pool rule 11 holds no value sketches: its own replays are judged on the signs.
        values = {c: data[f"{k}.values.{c}"] for c in r["clients"] if f"{k}.values.{c}" in data}
        pooled = score_with_pool(packer, pool, r["round"], peers=r["peers"], public=planes, values=values, **common)
        closes_run = r.get("closes_run", False) or close_last and k == len(meta["rounds"]) - 1
        settlements += close_round(pool, ClosingRound.scored(packer, r["round"], pooled, words=packer.words(),
                                                             participants=packer.clients, values=values,
                                                             closes_run=closes_run, **common))
        t = r["round"]
        rewards[t] = dict(pooled.report.rewards)
        undetermined[t] = tuple(pooled.undetermined)
        resubmitted[t] = tuple(pooled.resubmitted)
        forfeited[t] = tuple(pooled.forfeited)
    partition_of = {int(t): who for t, who in meta["partition_of"].items()}
    rounds = rounds_by_partition(rewards, settlements, undetermined, resubmitted, forfeited, partition_of)
    return {"args": {"capture": str(path), **{k: str(v) for k, v in overrides.items()}}, "attacks": meta["attacks"],
            "rounds": rounds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("captures", nargs="+", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="a PoolSettings field for the replay (JSON value or a word), e.g. rank_by=verdict")
    parser.add_argument("--out-dir", type=Path, default=None, help="write <capture>.json here")
    parser.add_argument("--close-last", action="store_true",
                        help="the last captured round closes the run (pool rule 17), as the live run's last round "
                             "does since; a capture of an earlier version did not")
    parser.add_argument("--check", type=Path, action="append", default=[],
                        help="the live run's --out JSON, one per capture: the replay must equal it")
    args = parser.parse_args(argv)
    overrides = {key: config_value(value) for key, _, value in (pair.partition("=") for pair in args.set)}
    failed = 0
    for k, path in enumerate(args.captures):
        out = replay(path, overrides, args.close_last)
        attack_of = {int(p): spec for p, spec in out["attacks"].items()}
        print(f"== {path}")
        print(summarise(out["rounds"], attack_of, argparse.Namespace(nodes="?", fraction="?", data_order="?",
                                                                     min_peers=None), 0.0))
        if args.out_dir is not None:
            args.out_dir.mkdir(parents=True, exist_ok=True)
            (args.out_dir / f"{path.stem}.json").write_text(json.dumps(out, indent=1))
        if k < len(args.check):
            live = json.loads(args.check[k].read_text())["rounds"]
            same = live == out["rounds"]
            failed += not same
            print(f"replay equals the live run {args.check[k]}: {same}")
    return int(failed > 0)


if __name__ == "__main__":
    raise SystemExit(main())
