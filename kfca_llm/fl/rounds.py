"""KFCA-FedAvg (the paper's Algorithm 2) with the attack analysis: the round driver.

Round t = 1..T:

1. Sample the round's clients (``clients_per_round``: FlowerTune's ``max(int(n * fraction), 2)``) from a
   seeded RNG. When the recipe lists attacks, client 0 is the *attack-analysis client*: it takes part in
   every round (its own history of honest updates is what ``stale``/``lagged:K`` replay) and the others
   are sampled from clients 1..n-1.
2. Every client trains from the global adapter (``client.train_client``), on whichever process, by the recipe's
   ``TrainingPlan`` (resolved once per run).
3. Submissions: each client sends its honest update, except the fixed attackers (``kfca.attackers =
   ["3=flip", ...]``), which send their attack; the analysis client also sends every listed strategy
   side by side. Attacks see the round's context (own history, the others' honest updates, the globals the
   client received: the newest ones the listed free riders read, this round's last).
4. ``scoring.score_round`` pays every submission against its peers on one task partition; copies among
   the real submissions are paid by ``kfca.duplicates`` (default: nothing).
5. FedAvg (weighted by examples) over the clients' honest updates (``kfca.aggregate = "honest"``: attacks
   change rewards, not the model: the paper's oracle), or over the submissions that ``aggregation_weights``
   keeps, with its weights (``"all"``, ``"exclude-negative"``, ``"reward-weighted"``: the rule of
   ``KFCAStrategy(aggregation=...)``). A round observer may replace this step (``FederationOptions.aggregator``).
6. The new global adapter is evaluated on held-out rows (``fl/evaluate.py``): loss and exact-answer accuracy.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..attacks import Attack, AttackContext, resolve_attack, resolve_attacks
from ..attacks_public import public_windows
from ..api import update_from_reference
from ..engine.public import receptions_kept
from ..errors import InputError
from ..recipe import Recipe, clients_per_round, fixed_attackers
from ..tensors import StateDict
from .aggregate import WeakVerdicts, aggregation_weights, fedavg
from .client import ClientUpdate, adapter_state, load_adapter_state, train_client, train_reference
from .distributed import Processes
from .evaluate import evaluate_global
from .peer_pool import PeerPool
from .records import FederationResult, RoundClock, RoundRecord, aggregated_shares
from .scoring import RoundScores, Submission, pool_settings, score_round
from .seeds import ATTACK, KFCA, SAMPLE, client_id, derive_seed
from .state import (last_complete_round, load_checkpoint, load_pool, load_publics, save_checkpoint,
                    save_client_updates, save_pool)
from .training_plan import TrainingPlan


@dataclass(frozen=True)
class FederationOptions:
    out_dir: Path | None = None
    """Where adapters and resume state go; None keeps nothing on disk."""
    resume: bool = False
    cpu: bool = False
    """Force the CPU even where CUDA is present."""
    progress: bool = True
    model_dir: Path | None = None
    data_dir: Path | None = None
    on_round: Callable[[RoundContext], None] | None = None
    """Called on the main process after each round is scored, before FedAvg (e.g. the Shapley valuation)."""
    aggregator: Callable[[RoundAggregation], tuple[StateDict, dict[str, float]]] | None = None
    """Replaces ``kfca.aggregate``: the new global adapter and each kept submission's weight (benchmarks
    put another server's aggregation, e.g. a Flower strategy's, on the same submissions)."""
    evaluate: bool = True
    """Evaluate the global adapter on held-out rows after every round (where the data set has some)."""


@dataclass(frozen=True)
class RoundContext:
    """What a round observer sees: the model (its adapter may be overwritten), the round's starting
    global adapter and every submission."""

    round: int
    model: object
    tokenizer: object
    pad_token_id: int
    device: torch.device
    global_state: StateDict
    submissions: list[Submission]


@dataclass(frozen=True)
class RoundAggregation:
    """What the aggregation step sees: the round's starting global adapter, every client's honest update,
    every submission and its reward (by ``Submission.id``)."""

    round: int
    global_state: StateDict
    trained: dict[str, ClientUpdate]
    submissions: list[Submission]
    rewards: dict[str, float]
    verdicts: WeakVerdicts | None = None
    """The submissions paid with the peer pool (``RoundScores.verdicts``), for ``kfca.weak-verdict``."""


SERVER_SENT = "@server"
"""The resume state's name for the globals the server sent (beside the attacking clients' received ones)."""
SERVER_KEPT = "@server-kept:"
"""The resume state's names for the older globals kept for returning clients (the round follows)."""


def public_steps(globals_sent: Sequence[StateDict]) -> list[StateDict]:
    """The steps between consecutive globals (oldest first): what the server's public trajectory says; each
    difference as ``score_checkpoints`` takes it from saved globals (``api.update_from_reference``)."""
    return [{name: update_from_reference(new[name], old[name]) for name in new}
            for old, new in zip(globals_sent, globals_sent[1:])]


def submission_rewards(submissions: list[Submission], scores: RoundScores) -> dict[str, float]:
    """Submission id -> its reward: a client's own submission, or the analysis client's strategy."""
    own = {**scores.honest_rewards, **scores.fixed_attacker_rewards}
    return {s.id: scores.strategy_rewards[s.strategy] if s.analysis else own[s.client] for s in submissions}


def settle_rounds(records: list[RoundRecord], settlements) -> None:
    """Pay the settled submissions of undetermined rounds (``fl.pool_settle``: earlier rounds, and at the run's last
    round that round too) in those rounds' records: a client's reward, and the analysis client's strategies (its
    honest update is its real submission)."""
    by_round = {r.round: r for r in records}
    for settled in settlements:
        record = by_round[settled.round]
        client, _, strategy = settled.participant.partition("/")  # Submission.id of a side-by-side submission
        if client == record.analysis_client:
            record.strategy_rewards[strategy or "honest"] = settled.reward
        for rewards in (record.honest_rewards, record.fixed_attacker_rewards):
            if settled.participant in rewards:
                rewards[settled.participant] = settled.reward


def sample_round_clients(recipe: Recipe, t: int, seed: int) -> list[int]:
    """Sorted client indices trained in round t (index 0 always, when the recipe lists attacks)."""
    k = clients_per_round(recipe)
    rng = np.random.default_rng(derive_seed(seed, SAMPLE, t))
    if recipe.kfca.attacks:
        others = rng.choice(np.arange(1, recipe.num_clients), size=k - 1, replace=False)
        return sorted([0, *others.tolist()])
    return sorted(rng.choice(recipe.num_clients, size=k, replace=False).tolist())


def public_history(sent: list[StateDict], kept: dict[int, StateDict], global_state: StateDict,
                   last_round: Mapping[int, int], t: int, indices: Sequence[int], history: int
                   ) -> tuple[list[StateDict], dict[int, StateDict], dict[int, StateDict]]:
    """Round ``t``'s globals the server keeps: ``sent`` the newest ``history + 1`` (this round's last), ``kept`` by
    round those older that a client was last sent (``engine.public.receptions_kept``, ``last_round`` before this
    round's clients); and the change since its own for each of ``indices`` back after more than ``history`` rounds
    (gap -> change: ``engine.public.public_planes``' ``changes``)."""
    if len(sent) > history:  # the global of round t - history - 1 leaves the newest
        kept = {**kept, t - history - 1: sent[-history - 1]}
    sent = [*sent, global_state][-(history + 1):]
    wanted = receptions_kept(last_round.values(), t - history, history)
    kept = {r: g for r, g in kept.items() if r in wanted}
    changes = {t - last_round[i]: public_steps([kept[last_round[i]], global_state])[0]
               for i in indices if last_round.get(i) in kept}
    return sent, kept, changes


def reception_gaps(last_round: Mapping[int, int], t: int, indices: Sequence[int]) -> list[int]:
    """The reception gaps of round ``t``'s clients ``indices`` (sorted): how many rounds, so how many of the global's
    steps, since each last received a global (``last_round``: client -> the last round it trained in; a client
    training for the first time has none)."""
    return sorted(t - last_round[i] for i in indices if i in last_round)


def attack_context(seed: int, t: int, client: str, key: str, honest: dict[str, StateDict],
                   history: list[StateDict], public: list[StateDict] = ()) -> AttackContext:
    """What ``client`` knows in round ``t``; its generator is keyed by ``key`` (the spec text), so a
    strategy draws the same noise whatever else is listed."""
    generator = torch.Generator().manual_seed(derive_seed(seed, ATTACK, t, zlib.crc32(key.encode())))
    return AttackContext(client=client, round=t, honest=honest[client], history=history, generator=generator,
                         others={c: u for c, u in honest.items() if c != client},
                         round_seed=derive_seed(seed, ATTACK, t), public=public)


def make_submissions(recipe: Recipe, t: int, trained: dict[str, ClientUpdate], analysis_client: str | None,
                     analysis: list[Attack], fixed: dict[str, Attack], histories: dict[str, list[StateDict]],
                     publics: dict[str, list[StateDict]] | None = None) -> list[Submission]:
    """Every submission the server receives in round ``t`` (see the module docstring); ``publics``: the
    attacking clients' received globals (``AttackContext.public``), this round's included."""
    seed = recipe.kfca.seed
    honest = {cid: r.update for cid, r in trained.items()}
    publics = publics or {}
    out = []
    for cid in sorted(trained):
        n = trained[cid].num_examples
        if cid in fixed:
            attack = fixed[cid]
            context = attack_context(seed, t, cid, f"{cid}={attack.spec}", honest, histories[cid],
                                     publics.get(cid, ()))
            out.append(Submission(cid, attack.spec, attack.submit(context), n))
        else:
            out.append(Submission(cid, "honest", honest[cid], n))
    if analysis_client is not None:
        n = trained[analysis_client].num_examples
        for attack in analysis:
            if attack.spec != "honest":
                context = attack_context(seed, t, analysis_client, attack.spec, honest, histories[analysis_client],
                                         publics.get(analysis_client, ()))
                out.append(Submission(analysis_client, attack.spec, attack.submit(context), n, analysis=True))
    return out


def aggregate_round(recipe: Recipe, round_: RoundAggregation) -> tuple[StateDict, dict[str, float]]:
    """The new global adapter under ``kfca.aggregate`` and the weight of each update it averaged."""
    if recipe.kfca.aggregate == "honest":
        weights = {cid: float(r.num_examples) for cid, r in round_.trained.items()}
        updates = {cid: r.update for cid, r in round_.trained.items()}
    else:
        weights = aggregation_weights(recipe.kfca.aggregate, round_.rewards,
                                      {s.id: s.num_examples for s in round_.submissions},
                                      verdicts=round_.verdicts, weak_verdict=recipe.kfca.weak_verdict)
        updates = {s.id: s.update for s in round_.submissions}
    if not weights:  # no submission kept: the global adapter stays
        return round_.global_state, weights
    return fedavg(round_.global_state, [(who, updates[who], w) for who, w in weights.items()]), weights


def federation_threads(recipe: Recipe, model_dir: Path | None) -> int | None:
    """torch's intra-op threads for the run (``train.torch-threads``); None: leave torch's setting alone."""
    from ..modeling import is_tiny

    if recipe.train.torch_threads:
        return recipe.train.torch_threads
    tiny = model_dir is None and is_tiny(recipe)
    return 1 if tiny and "OMP_NUM_THREADS" not in os.environ else None


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """torch runs on ``count`` intra-op threads inside the block (None: unchanged); the caller's setting after."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_federation(recipe: Recipe, options: FederationOptions = FederationOptions()) -> FederationResult:
    """Run KFCA-FedAvg for ``recipe.num_server_rounds`` rounds; see the module docstring."""
    with torch_threads(federation_threads(recipe, options.model_dir)):
        return _run_federation(recipe, options)


def _run_federation(recipe: Recipe, options: FederationOptions) -> FederationResult:
    from tqdm.auto import tqdm

    from ..data import load_client_datasets, load_heldout_examples, load_reference_examples
    from ..modeling import load_model_and_tokenizer

    procs = Processes(cpu=options.cpu)
    seed = recipe.kfca.seed
    plan = TrainingPlan.of(recipe)  # all that local training reads of the recipe
    analysis = resolve_attacks(recipe.kfca.attacks)
    strategies = [a.spec for a in analysis]
    analysis_client = client_id(0) if analysis else None
    fixed = {client_id(i): resolve_attack(spec) for i, spec in fixed_attackers(recipe).items()}
    result = FederationResult(recipe, seed, strategies)

    model, tokenizer = load_model_and_tokenizer(recipe, device=procs.device, model_dir=options.model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    datasets = load_client_datasets(recipe, tokenizer, data_dir=options.data_dir)
    heldout = load_heldout_examples(recipe, tokenizer, data_dir=options.data_dir) if options.evaluate else []
    reference_rows = (load_reference_examples(recipe, tokenizer, recipe.kfca.reference_rows, data_dir=options.data_dir)
                      if recipe.kfca.reference_rows else None)
    # One initial adapter for all processes (a real model's LoRA init draws from each process's RNG).
    global_state: StateDict = procs.broadcast(adapter_state(model))
    # Each attacking client's own honest updates, oldest first (what stale and lagged:K replay).
    histories: dict[str, list[StateDict]] = {cid: [] for cid in [*([analysis_client] if analysis else []), *fixed]}
    # The globals each attacking client received, oldest first: the newest ``window`` the free riders read.
    window = public_windows([a.spec for a in [*analysis, *fixed.values()]])
    publics: dict[str, list[StateDict]] = {cid: [] for cid in histories} if window else {}
    # The globals the server sent, oldest first: the newest ones give the public steps that scoring conditions on
    # (kfca.public-steps: the global's change over the last 1, 2, 4, ... rounds); older ones a client was last sent,
    # by round, until it returns (its reception gap longer than the steps: the change since its own global).
    sent: list[StateDict] = []
    kept: dict[int, StateDict] = {}
    # Client -> the last round it trained in (sampling is seeded: a resume replays it): its reception gap.
    last_round: dict[int, int] = {}
    pool = PeerPool(pool_settings(recipe))
    start = 1
    out_dir = Path(options.out_dir) if options.out_dir is not None else None
    if options.resume:
        if out_dir is None:
            raise InputError("--resume needs an output folder")
        done = last_complete_round(out_dir)
        if done:
            shapes = {name: tuple(v.shape) for name, v in global_state.items()}
            global_state, saved, result.rounds = load_checkpoint(out_dir, done, seed, strategies, recipe, shapes)
            histories.update(saved)
            if window or recipe.kfca.public_steps:
                loaded = load_publics(out_dir, done)
                sent = loaded.pop(SERVER_SENT, [])
                kept = {int(name[len(SERVER_KEPT):]): listed[0] for name, listed in loaded.items()
                        if name.startswith(SERVER_KEPT)}
                loaded = {name: listed for name, listed in loaded.items() if not name.startswith(SERVER_KEPT)}
                publics.update(loaded)
            pool = load_pool(out_dir, done, pool.settings)
            start = done + 1

    if recipe.kfca.public_steps and recipe.kfca.penalty == "sampled":  # after a resume's checks, before any training
        raise InputError('kfca.penalty = "sampled" draws penalty tasks from the whole of M_1 and M_2, not within '
                         "public strata: set kfca.public-steps = 0 with it (or keep the expected penalty)")
    for t in range(1, start):
        last_round.update(dict.fromkeys(sample_round_clients(recipe, t, seed), t))
    T = recipe.num_server_rounds
    show = options.progress and procs.is_main
    rounds_bar = tqdm(total=T, initial=start - 1, desc="rounds", unit="round", disable=not show)
    for t in range(start, T + 1):
        clock = RoundClock(procs.device)  # where the round's time goes (result.timings)
        indices = sample_round_clients(recipe, t, seed)
        mine = procs.my_share(indices)
        steps_bar = tqdm(total=sum(plan.local_steps(len(datasets[i])) for i in mine),
                         desc=f"round {t} local steps", unit="step", leave=False, disable=not show)
        local = [(client_id(i), train_client(model, global_state, datasets[i], plan, server_round=t,
                                             seed=plan.client_seed(t, i), device=procs.device,
                                             pad_token_id=pad_id, step_callback=lambda: steps_bar.update(1)))
                 for i in mine]
        steps_bar.close()
        trained = dict(sorted(procs.gather(local)))
        train_s = clock.lap()
        for cid, received in publics.items():
            if cid in trained:
                received.append(global_state)  # the global it trained from this round
                del received[:-window]
        submissions = make_submissions(recipe, t, trained, analysis_client, analysis, fixed, histories, publics)
        # The server's reference client: the same training from the same global on rows no client has (every
        # process trains it alike: a seeded, deterministic update; its time counts as training time).
        reference = None if reference_rows is None else train_reference(
            model, global_state, reference_rows, plan, server_round=t, device=procs.device, pad_token_id=pad_id)
        kfca_seed = derive_seed(seed, KFCA, t)
        train_s += clock.lap()
        sent, kept, changes = public_history(sent, kept, global_state, last_round, t, indices,
                                             recipe.kfca.conditioning.history)
        scores = score_round(submissions, analysis_client=analysis_client, kfca=recipe.kfca, kfca_seed=kfca_seed,
                             pool=pool, round_=t, reference=reference, public=public_steps(sent),
                             gaps=reception_gaps(last_round, t, indices), changes=changes, closes_run=t == T)
        last_round.update(dict.fromkeys(indices, t))
        scoring_s = clock.lap()
        start_state = global_state
        if options.on_round is not None and procs.is_main:
            options.on_round(RoundContext(t, model, tokenizer, pad_id, procs.device, start_state, submissions))
        clock.lap()
        aggregation = RoundAggregation(t, start_state, trained, submissions, submission_rewards(submissions, scores),
                                       scores.verdicts)
        aggregate = options.aggregator or (lambda round_: aggregate_round(recipe, round_))
        global_state, weights = aggregate(aggregation)
        aggregate_s = clock.lap()
        heldout_scores = evaluate_global(model, global_state, heldout, pad_id, procs.device) if heldout else None
        clock.lap()  # the evaluation counts in the round's wall time only
        for cid, history in histories.items():
            if cid in trained:
                history.append(trained[cid].update)

        result.rounds.append(RoundRecord(
            round=t, learning_rate=plan.lr(t), clients=list(trained), analysis_client=analysis_client,
            kfca_seed=kfca_seed, strategy_rewards=scores.strategy_rewards, honest_rewards=scores.honest_rewards,
            fixed_attacker_rewards=scores.fixed_attacker_rewards,
            fixed_attacks={cid: fixed[cid].spec for cid in trained if cid in fixed}, pairs=scores.pairs,
            categorical_world=scores.categorical_world,
            loss_before={c: r.loss_before for c, r in trained.items()},
            loss_after={c: r.loss_after for c, r in trained.items()},
            num_examples={c: r.num_examples for c, r in trained.items()}, duplicates=scores.duplicates,
            undetermined=scores.undetermined, pool_peers=scores.pool_peers, strategy_copies=scores.strategy_copies,
            strategy_own_resubmissions=scores.strategy_own_resubmissions,
            settlements=[settled.to_dict() for settled in scores.settlements], charged_back=scores.charged_back,
            aggregated=aggregated_shares(weights), heldout=heldout_scores))
        settle_rounds(result.rounds, scores.settlements)
        if out_dir is not None and procs.is_main:
            if recipe.train.save_client_updates:
                save_client_updates(out_dir, t, model, start_state,
                                    {s.client: s.update for s in submissions if not s.analysis})
            if t % max(recipe.train.save_every_round, 1) == 0 or t == T:
                save_pool(out_dir, t, pool)  # before the checkpoint's COMPLETE marker
                save_checkpoint(out_dir, t, model, global_state, histories, result,
                                {**publics, SERVER_SENT: sent, **{f"{SERVER_KEPT}{r}": [g] for r, g in kept.items()}}
                                if recipe.kfca.public_steps else publics)
        result.timings[t] = clock.timing(train_s=train_s, pack_s=scores.pack_s, score_s=scoring_s - scores.pack_s,
                                         aggregate_s=aggregate_s, save_s=clock.lap())
        procs.barrier()
        rounds_bar.update(1)
        if show:
            rounds_bar.set_postfix({s: f"{v:+.3f}" for s, v in list(scores.strategy_rewards.items())[:3]})
    rounds_bar.close()
    load_adapter_state(model, global_state)
    return result
