"""FlowerTune's regime under Flower's simulation engine: 20 nodes, ``FedAvg(fraction_train=0.1)`` (two nodes per
round), ``KFCAStrategy`` with its defaults (or ``--min-peers 0``: round peers only, as before the pool), and
deviating nodes (``kfca.attackers`` by partition id: flip, zero, random, stale by default).

    .venv/bin/python benchmarks/flower_few_peers.py --rounds 60 --out /tmp/flower60.json

Each client's data order: ``--data-order static`` (FlowerTune's ``train.dynamic-data-seed = false``: every
participation of a client trains on the same samples), ``dynamic`` (seeded by the round) or ``both`` (the default:
static first, then dynamic, one process each; ``--out`` gets ``.static`` / ``.dynamic`` before its suffix).

Prints, per round, the two participants (partition and attack) and their rewards, then the figures the issue
asks for: every round in which a flipping update (``flip``; ``flip-after:K`` after its K-th update; ``on-off`` its 2nd,
4th, ...) met an honest node (honest partner paid > 0 and > it?, counted apart in undetermined rounds, where neither is
paid), the mean reward per node, the AUROC of mean reward separating deviators from honest nodes, the undetermined rounds.
Heavy (Ray start-up ~20 s, then about 2 s a round on two cores): run it alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from kfca_llm.fl.pool_store import RANK_RULES, PoolSettings

ROOT = Path(__file__).resolve().parents[1]


def auroc(deviators: list[float], honest: list[float]) -> float:
    """P(a random honest node's mean reward > a random deviator's), ties counting half."""
    if not deviators or not honest:
        return float("nan")
    wins = sum((h > d) + 0.5 * (h == d) for h in honest for d in deviators)
    return wins / (len(honest) * len(deviators))


DATA_ORDERS = {"static": False, "dynamic": True}
"""``--data-order`` -> ``train.dynamic-data-seed``."""


def config_value(text: str):
    """A run-config value as Flower's ``--run-config`` reads it: a number or a boolean, else the word."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def run_each_data_order(args) -> int:
    """Each data order in a process of its own (Ray's workers read the run config from the environment at start)."""
    import subprocess

    for order in DATA_ORDERS:
        argv = [sys.executable, __file__, "--nodes", str(args.nodes), "--fraction", str(args.fraction), "--rounds",
                str(args.rounds), "--attackers", args.attackers, "--max-steps", str(args.max_steps),
                "--data-order", order]
        argv += [] if args.min_peers is None else ["--min-peers", str(args.min_peers)]
        argv += [] if args.own_replay_limit is None else ["--own-replay-limit", str(args.own_replay_limit)]
        argv += ["--rank-by", args.rank_by]
        argv += [f"--set={pair}" for pair in args.set]
        argv += [] if args.out is None else ["--out", str(args.out.with_suffix(f".{order}{args.out.suffix}"))]
        argv += [] if args.capture is None else ["--capture", str(args.capture.with_suffix(f".{order}.npz"))]
        print(f"== data order: {order} (train.dynamic-data-seed = {str(DATA_ORDERS[order]).lower()})", flush=True)
        if subprocess.run(argv).returncode:
            return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--attackers", default="3=flip,7=zero,11=random,15=stale")
    parser.add_argument("--min-peers", type=int, default=None, help="KFCAStrategy min_peers (default: its default)")
    parser.add_argument("--max-steps", type=int, default=8, help="local steps per round (the tiny recipe: 8)")
    parser.add_argument("--data-order", choices=("both", *DATA_ORDERS), default="both",
                        help="train.dynamic-data-seed false (static) or true (dynamic); both: static, then dynamic")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a recipe key of the run config (a number or a word), e.g. train.learning-rate-max=5e-5")
    parser.add_argument("--own-replay-limit", type=float, default=None,
                        help="signs an own resubmission may differ in (rule 3: 0.02; default: the data order's)")
    parser.add_argument("--rank-by", choices=RANK_RULES, default=PoolSettings().rank_by,
                        help="PoolSettings.rank_by: how a disagreeing pair is settled")
    parser.add_argument("--out", type=Path, default=None, help="write the per-round rewards as JSON here")
    parser.add_argument("--capture", type=Path, default=None,
                        help="save the scored rounds here (.npz) to pay them again under other settings (flower_capture.py)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.data_order == "both":
        return run_each_data_order(args)

    from flwr.serverapp.strategy import FedAvg
    from flwr.simulation import run_simulation

    from kfca_llm.fl.peer_pool import PeerPool
    from kfca_llm.flower import KFCAStrategy
    from kfca_llm.fl.scoring import own_replay_limit
    from kfca_llm.flower.server_app import make_server_app
    from kfca_llm.flower.task import recipe_from_config

    sys.path.insert(0, str(ROOT / "benchmarks"))
    os.environ["PYTHONPATH"] = str(ROOT / "benchmarks") + os.pathsep + os.environ.get("PYTHONPATH", "")
    config = {"num-server-rounds": args.rounds, "num-clients": args.nodes, "strategy.fraction-train": args.fraction,
              "train.training-arguments.max-steps": args.max_steps, "kfca.attackers": args.attackers,
              "kfca.ledger": "", "kfca.keep-signs": False, "train.dynamic-data-seed": DATA_ORDERS[args.data_order]}
    config |= {key: config_value(value) for key, _, value in (pair.partition("=") for pair in args.set)}
    os.environ["KFCA_FEW_PEERS_CONFIG"] = json.dumps(config)
    import flower_few_peers_client as client_module  # the ClientApp Ray's workers import
    extra = {} if args.min_peers is None else {"min_peers": args.min_peers}
    # As the recipes' app sets it for the data order, unless asked for another.
    extra["own_replay_limit"] = (args.own_replay_limit if args.own_replay_limit is not None
                                 else own_replay_limit(recipe_from_config(config)))

    class Strategy(KFCAStrategy):
        """The default KFCAStrategy around FedAvg(fraction_train); remembers each node's partition."""

        def __init__(self, wrapped, **recipe_settings):
            # The recipe's pool keys (``--set kfca.pool-peers=16``); the rest as the benchmark has always run it.
            pool = {key: recipe_settings[key] for key in ("pool_window", "pool_peers", "pool_weight")}
            super().__init__(FedAvg(fraction_train=args.fraction, fraction_evaluate=0.0), ledger=None, **pool, **extra)
            self.pool = PeerPool(dataclasses.replace(self.pool.settings, rank_by=args.rank_by))
            self.partition_of: dict[str, int] = {}
            self.resubmitted: dict[int, dict[str, tuple[str, ...]]] = {}
            self.forfeited: dict[int, dict[str, tuple[str, ...]]] = {}

        def _record(self, server_round, paid, identities, scored, failures, arrays):
            super()._record(server_round, paid, identities, scored, failures, arrays)
            if scored is not None:
                self.resubmitted[server_round] = dict(scored.pooled.resubmitted)
                self.forfeited[server_round] = dict(scored.pooled.forfeited)

        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            for m in replies:
                if m.has_content() and "metrics" in m.content:
                    self.partition_of[str(m.metadata.src_node_id)] = int(m.content["metrics"]["partition-id"])
            return super().aggregate_train(server_round, replies)

    capture = None
    if args.capture is not None:
        import kfca_llm.flower.strategy as strategy_module
        from flower_capture import Capture

        capture = strategy_module.score_round = Capture(strategy_module.score_round)
    done = {}
    server_app = make_server_app(config, strategy_class=Strategy,
                                 on_result=lambda strategy, result: done.update(strategy=strategy))
    started = time.time()
    run_simulation(server_app=server_app, client_app=client_module.client_app, num_supernodes=args.nodes,
                   backend_config={"client_resources": {"num_cpus": 1}, "init_args": {"num_cpus": 2}})
    wall = time.time() - started
    strategy = done["strategy"]
    attacks = dict(part.split("=", 1) for part in args.attackers.split(",") if part)
    attack_of = {int(p): spec for p, spec in attacks.items()}
    partition_of = {t: {who: strategy.partition_of[n] for who, n in nodes.items()}
                    for t, nodes in strategy.node_ids.items()}
    rounds = rounds_by_partition(strategy.rewards, [s for ss in strategy.settlements.values() for s in ss],
                                 strategy.undetermined, strategy.resubmitted, strategy.forfeited, partition_of)
    if capture is not None:
        capture.save(args.capture, partition_of, attacks)
    print(summarise(rounds, attack_of, args, wall))
    from bench_few_peers import markdown, measure

    figures = measure({r["round"]: r["rewards"] for r in rounds}, sum(bool(r["undetermined"]) for r in rounds),
                      len(rounds), deviators={str(p) for p in attack_of},
                      charged_back={r["round"]: {str(p) for p in r["resubmitted"] + r["forfeited"]} for r in rounds})
    print(markdown([{"deviation": ", ".join(sorted(attacks.values())), "setting": "today (min_peers 0)"
                     if args.min_peers == 0 else "pool (defaults)" if args.min_peers is None
                     else f"min_peers {args.min_peers}", **figures}]))
    if args.out is not None:
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "wall_s": wall,
                                        "attacks": attacks, "rounds": rounds}, indent=1))
    return 0


def rounds_by_partition(rewards, settlements, undetermined, resubmitted, forfeited, partition_of) -> list[dict]:
    """The rounds as ``--out`` writes them, by partition: ``rewards`` round -> participant -> reward, each settlement
    paid in its round and listed with the round that settled it; undetermined and never settled: not paid (listed);
    ``undetermined`` / ``resubmitted`` / ``forfeited`` round -> participants; ``partition_of`` round -> participant ->
    partition."""
    paid, settled = {t: dict(r) for t, r in rewards.items()}, {}
    for settlement in settlements:
        paid[settlement.round][settlement.participant] = settlement.reward
        settled[(settlement.round, settlement.participant)] = settlement.settled_in
    rounds = []
    for t, by_participant in sorted(paid.items()):
        part = partition_of[t]
        rounds.append({"round": t, "rewards": {str(p): r for p, r in sorted((part[w], r) for w, r in
                                                                              by_participant.items())},
                       "undetermined": [part[w] for w in undetermined.get(t, ()) if (t, w) not in settled],
                       "settled": {str(part[w]): settled[(t, w)] for w in by_participant if (t, w) in settled},
                       "resubmitted": [part[w] for w in resubmitted.get(t, ())],
                       "forfeited": [part[w] for w in forfeited.get(t, ())]})
    return rounds


def summarise(rounds: list[dict], attack_of: dict[int, str], args, wall: float) -> str:
    lines = [f"{args.nodes} nodes, fraction_train {args.fraction}, data order {args.data_order}, {len(rounds)} rounds scored, "
             f"min_peers {'default' if args.min_peers is None else args.min_peers}, wall {wall:.0f} s"]
    for r in rounds:
        tag = ", ".join(f"{p}{'=' + attack_of[int(p)] if int(p) in attack_of else ''} {v:+.4f}"
                        for p, v in r["rewards"].items())
        later = r.get("settled", {})
        lines.append(f"round {r['round']:3d}: {tag}{'  UNDETERMINED' if r['undetermined'] else ''}"
                     + (f"  settled in round {sorted(set(later.values()))}" if later else ""))
    # A partner never settled: the pool could not tell who deviated, neither is paid.
    every = flip_meetings(rounds, attack_of)
    met = [m for m in every if not m.undetermined]
    meetings, unpaid, good = len(met), len(every) - len(met), sum(m.right for m in met)
    paid = paid_by_node(rounds)
    means = {p: sum(v) / len(v) for p, v in sorted(paid.items())}
    honest_paid = [v for p, values in paid.items() if p not in attack_of for v in values]
    honest_taken = sum(p not in attack_of for r in rounds for p in r.get("resubmitted", []))
    honest_forfeits = sum(p not in attack_of for r in rounds for p in r.get("forfeited", []))
    lines.append(f"honest participations taken for own resubmissions (charged back): {honest_taken} of "
                 f"{len(honest_paid)}; honest participations forfeiting earlier ones as turned (charged back): "
                 f"{honest_forfeits}; honest paid < 0: {sum(v < 0 for v in honest_paid)} "
                 f"({sum(v < 0 for v in honest_paid) / max(len(honest_paid), 1):.0%}); honest nodes whose mean is "
                 f"exactly 0: {sum(m == 0 for p, m in means.items() if p not in attack_of)} of "
                 f"{sum(p not in attack_of for p in means)}")
    dev = [m for p, m in means.items() if p in attack_of]
    hon = [m for p, m in means.items() if p not in attack_of]
    lines.append("mean reward per node: " + ", ".join(
        f"{p}{'=' + attack_of[p] if p in attack_of else ''} {m:+.4f} ({len(paid[p])})" for p, m in means.items()))
    lines.append(f"flipping updates' honest partners paid > 0 and > the flipping node: {good} of {meetings} meetings "
                 f"(+{unpaid} in undetermined rounds never settled, neither paid)")
    if dev and hon:  # a short run may never sample a deviator
        lines.append(f"max deviator mean {max(dev):+.4f} < min honest mean {min(hon):+.4f}: {max(dev) < min(hon)}; "
                     f"AUROC {auroc(dev, hon):.3f}")
    lines.append(f"undetermined rounds never settled: {[r['round'] for r in rounds if r['undetermined']]}; settled "
                 f"later: {[r['round'] for r in rounds if r.get('settled')]}")
    return "\n".join(lines)


def paid_by_node(rounds: list[dict]) -> dict[int, list[float]]:
    """Partition -> what each of its participations was paid, in round order (one left undetermined: 0)."""
    paid: dict[int, list[float]] = {}
    for r in rounds:
        for p, v in r["rewards"].items():
            paid.setdefault(int(p), []).append(v)
    return paid


class Meeting(NamedTuple):
    """An honest node's participation beside a flipping update (a named tuple: the docs' tests load this script by
    path, outside ``sys.modules``, where a dataclass cannot resolve its annotations)."""

    round: int
    partner: int
    partner_paid: float
    flipper: int
    flipper_paid: float
    undetermined: bool
    """The partner was never settled (paid 0)."""

    @property
    def right(self) -> bool:
        """The done-when's test: the honest partner paid > 0 and more than the flipping node."""
        return self.partner_paid > 0 and self.partner_paid > self.flipper_paid


def flip_meetings(rounds: list[dict], attack_of: dict[int, str]) -> list[Meeting]:
    """Every meeting of an honest node (not in ``attack_of``) with a node whose update flips in that round (``flips``,
    counting its participations)."""
    found, count = [], {}
    for r in rounds:
        rewards = {int(p): v for p, v in r["rewards"].items()}
        flipper = next((p for p in rewards if p in attack_of and flips(attack_of[p], count.get(p, 0))), None)
        for p in rewards:
            count[p] = count.get(p, 0) + 1
        if flipper is not None:
            found += [Meeting(r["round"], p, v, flipper, rewards[flipper], p in r["undetermined"])
                      for p, v in rewards.items() if p not in attack_of]
    return found


def kinds_by_round(rounds: Iterable[tuple[int, Iterable[int]]], attack_of: Mapping[int, str]
                   ) -> dict[int, dict[int, str]]:
    """Round -> partition -> its kind there: "honest", "flipping" (an attacker whose update flips at that
    participation, ``flips``) or its attack; ``rounds``: (round, its partitions), in round order."""
    count: dict[int, int] = {}
    found = {}
    for t, partitions in rounds:
        partitions = list(partitions)
        found[t] = {p: "honest" if p not in attack_of else "flipping" if flips(attack_of[p], count.get(p, 0))
                    else attack_of[p] for p in partitions}
        for p in partitions:
            count[p] = count.get(p, 0) + 1
    return found


def flips(spec: str, updates_before: int) -> bool:
    """Whether a node of attack ``spec`` flips its update after ``updates_before`` updates of its own (``flip``,
    ``flip-after:K``, ``on-off``; any other attack: no)."""
    name, _, parameter = spec.partition(":")
    return (name == "flip" or (name == "flip-after" and updates_before >= int(parameter))
            or (name == "on-off" and updates_before % 2 == 1))


if __name__ == "__main__":
    raise SystemExit(main())
