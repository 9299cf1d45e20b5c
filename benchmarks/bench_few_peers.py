"""FlowerTune's regime (20 clients x 0.1: two per round) on the tiny recipe: round peers only, the peer pool, a
trusted reference and FLTrust's trust score.

One federation is trained honestly (``run_federation``, ``kfca.aggregate = "honest"``: deviations change rewards,
not the model, as ``kfca.attackers`` does in ``kfca-llm simulate``) and each round's honest updates are kept; then
each deviation is replayed on the same updates: the deviating clients (3 of 20, 15%) submit the attack whenever
they are sampled, and every scoring setting scores the same submissions.

    .venv/bin/python benchmarks/bench_few_peers.py --rounds 200 --grid        # the full grid (hours on 2 cores)
    .venv/bin/python benchmarks/bench_few_peers.py --rounds 60 --cache /tmp/updates60.safetensors --grid
    .venv/bin/python benchmarks/bench_few_peers.py --rounds 200 --cache /tmp/updates200.safetensors --done-when 30

Every table is printed for each data order of the clients' training (``--data-order``, default both, static first):
``static`` is FlowerTune's ``train.dynamic-data-seed = false`` (every participation of a client trains on the same
samples, so its updates of different rounds are alike), ``dynamic`` seeds the order by the round. A ``--cache`` file
``X.safetensors`` is kept per order as ``X.static.safetensors`` and ``X.dynamic.safetensors``.

Per (deviation, setting): the honest partner's fine over the deviator's (sum over the rounds where a deviator
trained beside an honest client of max(-reward, 0), honest over deviator; 1.0: fined alike; "-": the deviator
was not fined), the honest partners paid > 0 and more than the deviator there, the share of honest participations
paid < 0, the AUROC of per-client mean reward separating deviators from honest clients after T rounds (T = 10, 50,
... up to --rounds), the first round from which the AUROC stays 1.0, and the undetermined rounds never settled (the
pool settles undetermined participants later, once the rounds on both sides of theirs can tell: ``fl.pool_settle``;
a settled reward counts in its round). Deviations: the attack registry's flip, zero, random, stale (its first
honest update, resubmitted), sparse:0.5, copy:0 (the partner's update of the round) and copy-pool (another client's
update from an earlier round: a copy of a pool member).

The pool runs with pool rule 15 off (``few_peers_done_when.NEXT_ROUND``): it reads the round after a disagreeing pair,
and every round after a deviation here is the honest federation's, which never aggregated it.

The two settings that need a clean data set on the server use the same reference update each round: the tiny
recipe's training from the round's global on ``REFERENCE_ROWS`` rows no client has (``kfca.reference-rows``).
"reference" scores it as a peer of weight ``DEFAULT_REFERENCE_WEIGHT`` (no pool); "FLTrust trust score" pays
each participant ReLU(cos(update, reference)) (Cao et al. 2021's weight; never negative, so it fines no one).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import torch

from kfca_llm.api import pack_updates
from kfca_llm.attacks import resolve_attack
from kfca_llm.fl.peer_pool import PeerPool, PoolSettings, score_with_pool
from kfca_llm.fl.pool_policy import eligible
from kfca_llm.fl.pool_store import RANK_RULES
from kfca_llm.fl.pool_copies import DYNAMIC_ORDER_OWN_REPLAY_LIMIT, OWN_REPLAY_MAX_DISAGREEMENT
from kfca_llm.fl.reference import DEFAULT_REFERENCE_WEIGHT, REFERENCE, reference_signs
from kfca_llm.fl.rounds import attack_context
from kfca_llm.fl.seeds import KFCA, client_id, derive_seed

sys.path.insert(0, str(Path(__file__).resolve().parent))
from few_peers_done_when import DONE_WHEN, NEXT_ROUND, close_defaults, done_when_table  # noqa: E402

DEVIATORS = (3, 7, 11)
NOISY_STALE = "stale+noise"
"""``stale`` with 0.1% of its coordinates replaced by noise (``sparse:0.999`` of the replay): about 0.05% of its signs
differ from the update it replays, as much as an honest retrain on the same samples late in training."""
DEVIATIONS = ("flip", "zero", "random", "stale", NOISY_STALE, "sparse:0.5", "copy:0", "copy-pool")
CHECKPOINTS = (10, 50, 200)
REFERENCE_ROWS = 32
REFERENCE_SETTING, FLTRUST_SETTING = "reference (no pool)", "FLTrust trust score"
DATA_ORDERS = {"static": False, "dynamic": True}
"""``--data-order`` -> ``train.dynamic-data-seed``."""


class RandomDrawPool(PeerPool):
    """The pool drawing its peers at random among the window's distinct participants (seeded by round)."""

    def candidates(self, before_round, participant, exclude, horizon=None):
        entries = eligible(self, before_round, participant, exclude, horizon)
        rng = np.random.default_rng([before_round, sum(map(ord, participant))])
        order = rng.permutation(len(entries))[:self.settings.pool_peers]
        return [entries[k] for k in sorted(order)]


def capture(rounds: int, cache: Path | None, dynamic: bool, overrides: tuple[str, ...] = ()
            ) -> dict[int, dict[str, dict[str, np.ndarray]]]:
    """Round -> client -> honest update, from one honest tiny federation at 20 x 0.1 (cached as safetensors), the
    clients' data order seeded by the round (``dynamic``) or the same in every round; ``overrides``: more recipe keys
    (``KEY=VALUE``; a cache holds whatever it was captured with)."""
    from safetensors.numpy import load_file, save_file

    order = next(name for name, value in DATA_ORDERS.items() if value == dynamic)
    cache = None if cache is None else cache.with_suffix(f".{order}{cache.suffix}")
    if cache is not None and cache.is_file():
        flat = load_file(str(cache))
    else:
        from kfca_llm.fl.rounds import FederationOptions, run_federation
        from kfca_llm.recipe import load_recipe

        from kfca_llm.data import load_reference_examples
        from kfca_llm.fl.client import train_reference
        from kfca_llm.fl.training_plan import TrainingPlan

        recipe = load_recipe("tiny", ["num-clients=20", "strategy.fraction-train=0.1", f"num-server-rounds={rounds}",
                                      'kfca.attacks=["honest"]', "train.save-client-updates=false",
                                      f"train.dynamic-data-seed={str(dynamic).lower()}", *overrides])
        flat, reference_rows, plan = {}, [], TrainingPlan.of(recipe)

        def keep(context):
            if not reference_rows:
                reference_rows.append(load_reference_examples(recipe, context.tokenizer, REFERENCE_ROWS))
            # What simulate's kfca.reference-rows trains (after the clients, from the round's global).
            server = train_reference(context.model, context.global_state, reference_rows[0], plan,
                                     server_round=context.round, device=context.device,
                                     pad_token_id=context.pad_token_id)
            for client, update in [*((s.client, s.update) for s in context.submissions), (REFERENCE, server)]:
                for name, tensor in update.items():
                    flat[f"{context.round:04d}|{client}|{name}"] = tensor.detach().cpu().float().numpy().copy()
            if context.round % 10 == 0:
                print(f"trained round {context.round} at {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)

        run_federation(recipe, FederationOptions(progress=False, on_round=keep))
        if cache is not None:
            save_file(flat, str(cache))
    out: dict[int, dict[str, dict[str, np.ndarray]]] = {}
    for key, array in flat.items():
        t, client, name = key.split("|", 2)
        if int(t) <= rounds:
            out.setdefault(int(t), {}).setdefault(client, {})[name] = array
    return dict(sorted(out.items()))


def synthetic(rounds: int, dynamic: bool = True, size: int = 4096, seed: int = 0
              ) -> dict[int, dict[str, dict[str, np.ndarray]]]:
    """CI-sized stand-in for ``capture``: 20 clients, two sampled per round; each round's honest direction turns
    back on the last one (as the tiny recipe's do) around a persistent one, plus each client's noise: fresh every
    round (``dynamic``), or mostly the client's own in every round, as its samples are under a static data order."""
    rng = np.random.default_rng(seed)
    own = np.random.default_rng([seed, 1]).standard_normal((100, size))
    persistent, direction = rng.standard_normal(size), rng.standard_normal(size)
    out = {}
    for t in range(1, rounds + 1):
        direction = -0.6 * direction + 0.8 * rng.standard_normal(size)
        clients = sorted(rng.choice(20, size=2, replace=False).tolist())
        out[t] = {client_id(c): {"w": (0.3 * persistent + direction + (rng.standard_normal(size) if dynamic else
                                                                       own[c] + 0.3 * rng.standard_normal(size))
                                       ).astype(np.float32)} for c in [*clients, 99]}  # client 99 never trains: the server's reference
        out[t][REFERENCE] = out[t].pop(client_id(99))
    return out


def submissions(updates, deviation: str) -> dict[int, dict[str, dict[str, np.ndarray]]]:
    """Each round's submissions when the deviators submit ``deviation`` whenever they train."""
    deviators = {client_id(i) for i in DEVIATORS}
    history: dict[str, list] = {c: [] for c in deviators}
    earlier: list[tuple[int, str, dict]] = []  # (round, client, update) of honest clients, for copy-pool
    out = {}
    for t, clients in updates.items():
        clients = {c: u for c, u in clients.items() if c != REFERENCE}
        honest = {c: {k: torch.from_numpy(v) for k, v in u.items()} for c, u in clients.items()}
        round_out = {}
        for c, u in sorted(clients.items()):
            if c not in deviators:
                round_out[c] = u
            elif deviation == "copy-pool":
                source = next((e for e in reversed(earlier) if e[1] != c), None)
                round_out[c] = u if source is None else source[2]
            elif deviation == NOISY_STALE:
                context = attack_context(0, t, c, f"{c}={deviation}", honest, history[c])
                replay = resolve_attack("stale").submit(context)
                noisy = resolve_attack("sparse:0.999")(replay, [], context.generator) if history[c] else replay
                round_out[c] = {k: v.numpy() for k, v in noisy.items()}
            else:
                context = attack_context(0, t, c, f"{c}={deviation}", honest, history[c])
                round_out[c] = {k: v.numpy() for k, v in resolve_attack(deviation).submit(context).items()}
        for c in clients:
            if c in history:
                history[c].append(honest[c])
        earlier += [(t, c, u) for c, u in clients.items() if c not in deviators]
        out[t] = round_out
    return out


def settings_grid(full: bool, own_replay_limit: float) -> dict[str, tuple[type, PoolSettings | None]]:
    grid = {"round peers only (today)": (PeerPool, None),
            "pool (defaults)": (PeerPool, PoolSettings(own_replay_limit=own_replay_limit, next_round=NEXT_ROUND)),
            REFERENCE_SETTING: (PeerPool, None), FLTRUST_SETTING: (PeerPool, None)}
    if full:
        for window, peers, weight in itertools.product((5, 10, 20), (4, 8, 16), (0.5, 1.0, 2.0, 4.0)):
            settings = PoolSettings(window=window, pool_peers=peers, weight=weight, own_replay_limit=own_replay_limit,
                                    next_round=NEXT_ROUND)
            grid[f"pool W={window} K={peers} w={weight}"] = (PeerPool, settings)
        grid["pool random draw W=10 K=8 w=1"] = (RandomDrawPool, PoolSettings(own_replay_limit=own_replay_limit,
                                                                                 next_round=NEXT_ROUND))
    return grid


def fltrust_scores(round_submissions, reference) -> dict[str, float]:
    """FLTrust's trust score of each submission: ReLU of its cosine with the server's update."""
    server = np.concatenate([np.ravel(reference[k]) for k in sorted(reference)]).astype(np.float64)
    out = {}
    for client, update in round_submissions.items():
        mine = np.concatenate([np.ravel(np.asarray(update[k])) for k in sorted(reference)]).astype(np.float64)
        norms = np.linalg.norm(mine) * np.linalg.norm(server)
        out[client] = max(float(mine @ server / norms), 0.0) if norms > 0 else 0.0
    return out


def auroc(deviators, honest) -> float:
    if not deviators or not honest:
        return float("nan")
    return sum((h > d) + 0.5 * (h == d) for h in honest for d in deviators) / (len(honest) * len(deviators))


def measure(rounds_rewards: dict[int, dict[str, float]], undetermined: int, rounds: int,
            deviators: set[str] | None = None, charged_back: dict[int, set[str]] | None = None) -> dict:
    """The figures of one (deviation, setting); ``charged_back``: round -> participants charged back what earlier
    submissions of theirs were paid (taken for resubmitting one, or forfeiting them by a turn), of which the honest
    ones are counted."""
    deviators = {client_id(i) for i in DEVIATORS} if deviators is None else deviators
    honest_fine = deviator_fine = 0.0
    honest_paid, partners = [], []
    sums: dict[str, list[float]] = {}
    curve = {}
    for t, rewards in rounds_rewards.items():
        if set(rewards) & deviators and set(rewards) - deviators:
            honest_fine += sum(max(-r, 0.0) for c, r in rewards.items() if c not in deviators)
            deviator_fine += sum(max(-r, 0.0) for c, r in rewards.items() if c in deviators)
            worst = max(r for c, r in rewards.items() if c in deviators)
            partners += [r > 0 and r > worst for c, r in rewards.items() if c not in deviators]
        honest_paid += [r for c, r in rewards.items() if c not in deviators]
        for c, r in rewards.items():
            acc = sums.setdefault(c, [0.0, 0])
            acc[0] += r
            acc[1] += 1
        means = {c: s / n for c, (s, n) in sums.items()}
        curve[t] = auroc([m for c, m in means.items() if c in deviators], [m for c, m in means.items() if c not in deviators])
    separated = next((t for t in curve if all(curve[u] == 1.0 for u in curve if u >= t)), None)
    charged = None if charged_back is None else sum(len(who - deviators) for who in charged_back.values())
    return {"partner_fine_ratio": honest_fine / deviator_fine if deviator_fine > 1e-12 else None,
            "honest_charged_back": charged,
            "partners_paid_more": (sum(partners), len(partners)),
            "honest_negative_share": float(np.mean([r < 0 for r in honest_paid])) if honest_paid else None,
            "auroc": {t: curve[t] for t in (*CHECKPOINTS, rounds) if t in curve},
            "separated_from_round": separated, "undetermined_rounds": undetermined, "curve": curve}


def run(updates, full: bool, deviations=DEVIATIONS, own_replay_limit: float = 0.0) -> list[dict]:
    rows = []
    for deviation in deviations:
        submitted = submissions(updates, deviation)
        packers = {t: pack_updates(s) for t, s in submitted.items()}
        for name, (pool_class, settings) in settings_grid(full, own_replay_limit).items():
            if name == FLTRUST_SETTING:
                trust = {t: fltrust_scores(s, updates[t][REFERENCE]) for t, s in submitted.items()}
                rows.append({"deviation": deviation, "setting": name, **measure(trust, 0, len(updates))})
                continue
            pool = None if settings is None else pool_class(settings)
            rewards, unsure, charged_back = {}, {}, {}
            for t, packer in packers.items():
                reference = reference_signs(packer, updates[t][REFERENCE]) if name == REFERENCE_SETTING else None
                seed = derive_seed(0, KFCA, t)
                scored = score_with_pool(packer, pool, t, seed=seed, reference=reference,
                                         reference_weight=DEFAULT_REFERENCE_WEIGHT)
                rewards[t], unsure[t] = dict(scored.report.rewards), set(scored.undetermined)
                charged_back[t] = set(scored.resubmitted) | set(scored.forfeited)
                for done in [] if pool is None else close_defaults(pool, packer, t, scored, seed):
                    rewards[done.round][done.participant] = done.reward  # paid in its round from then on
                    unsure[done.round].discard(done.participant)
            rows.append({"deviation": deviation, "setting": name,
                         **measure(rewards, sum(bool(u) for u in unsure.values()), len(updates),
                                   charged_back=charged_back)})
    return rows


def markdown(rows: list[dict]) -> str:
    checkpoints = sorted({t for r in rows for t in r["auroc"]})
    lines = ["| deviation | setting | partner's fine / deviator's | partners paid > 0 and > deviator | honest paid < 0 | "
             "honest charged back | " + " | ".join(f"AUROC @{t}" for t in checkpoints) + " | AUROC 1.0 from round | undetermined rounds never settled |",
             "|---|---|---|---|---|---|" + "---|" * len(checkpoints) + "---|---|"]
    for r in rows:
        ratio = "-" if r["partner_fine_ratio"] is None else f"{r['partner_fine_ratio']:.2f}"
        aurocs = " | ".join(f"{r['auroc'][t]:.3f}" if t in r["auroc"] else "" for t in checkpoints)
        good, meetings = r["partners_paid_more"]
        charged = "-" if r.get("honest_charged_back") is None else r["honest_charged_back"]
        lines.append(f"| {r['deviation']} | {r['setting']} | {ratio} | {good}/{meetings} | {r['honest_negative_share']:.2f} | "
                     f"{charged} | {aurocs} | "
                     f"{r['separated_from_round'] if r['separated_from_round'] is not None else 'never'} | "
                     f"{r['undetermined_rounds']} |")
    return "\n".join(lines)


def figure(rows: list[dict], path: Path) -> None:
    """AUROC of the running mean rewards against rounds, per deviation: today's round peers vs the pool."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    deviations = list(dict.fromkeys(r["deviation"] for r in rows))
    fig, axes = plt.subplots(1, len(deviations), figsize=(2.6 * len(deviations), 2.8), sharey=True, squeeze=False)
    for ax, deviation in zip(axes[0], deviations):
        for r in rows:
            if r["deviation"] == deviation and r["setting"] in ("round peers only (today)", "pool (defaults)"):
                ax.plot(list(r["curve"]), list(r["curve"].values()), label=r["setting"])
        ax.set_title(deviation, fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylim(0.0, 1.05)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("AUROC of mean reward")
    axes[0][0].legend(fontsize=7, loc="lower right")
    fig.suptitle("20 clients x 0.1 (two per round), 3 deviators: deviators vs honest clients by mean reward", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--cache", type=Path, default=None, help="safetensors file of the honest updates (read or written)")
    parser.add_argument("--grid", action="store_true", help="also every pool variant (window, peers, weight, random draw)")
    parser.add_argument("--deviations", default=",".join(DEVIATIONS))
    parser.add_argument("--figure", type=Path, default=None, help="draw the AUROC curves into this PNG")
    parser.add_argument("--synthetic", action="store_true", help="synthetic updates instead of training (CI smoke)")
    parser.add_argument("--data-order", choices=("both", *DATA_ORDERS), default="both",
                        help="the clients' train.dynamic-data-seed: false (static), true (dynamic); both: static first")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a recipe key for the capture")
    parser.add_argument("--attackers", action="append", default=[], metavar="NODE=SPEC",
                        help="--done-when: replace a deviating node's attack (e.g. 3=flip-after:3, 3=on-off)")
    parser.add_argument("--rank-by", choices=RANK_RULES, default="record", help="PoolSettings.rank_by (--done-when)")
    parser.add_argument("--own-replay-limit", type=float, default=None,
                        help="signs an own resubmission may differ in (rule 3: 0.02; default: the data order's)")
    parser.add_argument("--done-when", type=int, default=0, metavar="SEEDS",
                        help="replay the issue's done-when run (20 nodes, 2 a round, flip/zero/random/stale) SEEDS "
                             "times per 60-round window of the captured updates, print the table, and stop")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    orders = list(DATA_ORDERS) if args.data_order == "both" else [args.data_order]
    for order in orders:
        started = time.time()
        dynamic = DATA_ORDERS[order]
        # As simulate and the recipes' app set it for the data order, unless asked for another.
        limit = args.own_replay_limit if args.own_replay_limit is not None else (
            DYNAMIC_ORDER_OWN_REPLAY_LIMIT if dynamic else OWN_REPLAY_MAX_DISAGREEMENT)
        updates = (synthetic(args.rounds, dynamic) if args.synthetic
                   else capture(args.rounds, args.cache, dynamic, tuple(args.set)))
        print(f"## data order: {order} (train.dynamic-data-seed = {str(dynamic).lower()})\n")
        if args.done_when:
            attackers = {**DONE_WHEN, **{int(i): spec for i, _, spec in (part.partition("=") for part in args.attackers)}}
            print(done_when_table(updates, args.done_when, own_replay_limit=limit, attackers=attackers,
                                  rank_by=args.rank_by))
        else:
            rows = run(updates, args.grid, tuple(args.deviations.split(",")), limit)
            print(markdown(rows))
            if args.figure is not None:
                figure(rows, args.figure.with_suffix(f".{order}{args.figure.suffix}") if len(orders) > 1 else args.figure)
        print(f"\n({time.time() - started:.0f} s)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
