"""KFCA-FedAvg (the paper's Algorithm 2) for federated LoRA/DoRA fine-tuning, with the attack analysis.

Round t = 1..T:

1. Sample the round's clients (``clients_per_round``: FlowerTune's ``max(int(n * fraction), 2)``) from a
   seeded RNG. When the recipe lists attacks, client 0 is the *attacking client*: it takes part in every
   round (its own history of honest updates is what ``stale``/``lagged:K`` replay) and the others are
   sampled from clients 1..n-1.
2. Every client starts from the global adapter, trains at most ``max-steps`` optimizer steps (batch x
   gradient accumulation from the recipe) at the round's cosine learning rate, and returns its update
   ``local adapter - global adapter``. Its data order, dropout and LoRA noise are seeded from
   (seed, round, client) alone, so the result does not depend on which process trains it.
3. The attacking client trains honestly and then submits *every* attack strategy side by side. One
   ``score_updates`` call per round scores each submission against the same honest peer(s), and each
   honest client against the other clients' honest updates, on one shared seeded task partition.
   Fixed attackers (``kfca.attackers = ["3=flip", ...]``) also train honestly when sampled, but what the
   server sees from them is their attack (on their own history of honest updates): every client is scored
   against those submissions, and the fixed attackers are paid for them.
4. FedAvg (weighted by number of examples) over the honest updates (``kfca.aggregate = "honest"``), or over
   every submission (``"all"``: fixed attackers contribute their attack; each analysis submission counts as
   one more client with the attacker's number of examples; its ``honest`` submission is its honest update,
   counted once).

With several processes (``accelerate launch``), the round's clients are dealt round-robin (in sorted id
order) to the processes; every process then gathers all honest updates, aggregates them in sorted client
order and scores the same inputs, so one process and several give bit-identical rewards and adapters.
"""

from __future__ import annotations

import json
import math
import os
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .attacks import Attack, resolve_attack, resolve_attacks
from .errors import InputError
from .report import write_atomic
from .recipe import Recipe, clients_per_round, fixed_attackers, lr_for_round, recipe_to_dict

StateDict = dict[str, torch.Tensor]

# Purposes of derived seeds: one independent stream per use, so adding a use never shifts another.
_SAMPLE, _TRAIN, _ATTACK, _KFCA = 1, 2, 3, 4
MAX_GRAD_NORM = 1.0  # Hugging Face Trainer's default, which FlowerTune's apps used
_ROUND_DIR = re.compile(r"^round-(\d{3,})$")


def derive_seed(seed: int, *keys: int) -> int:
    """A 32-bit seed derived from ``seed`` and integer keys (numpy SeedSequence: well mixed, stable)."""
    return int(np.random.SeedSequence([int(seed), *map(int, keys)]).generate_state(1, np.uint32)[0])


def client_id(index: int) -> str:
    return f"client-{index:03d}"


def submission_id(attacker: str, spec: str) -> str:
    """Score id of an attack submission; ``honest`` is the attacker's own honest update."""
    return attacker if spec == "honest" else f"{attacker}/{spec}"


def attacks_enabled(recipe: Recipe) -> bool:
    return len(recipe.kfca.attacks) > 0


def sample_round_clients(recipe: Recipe, t: int, seed: int) -> list[int]:
    """Sorted client indices trained in round t (index 0 always, when the recipe lists attacks)."""
    k = clients_per_round(recipe)
    rng = np.random.default_rng(derive_seed(seed, _SAMPLE, t))
    if attacks_enabled(recipe):
        others = rng.choice(np.arange(1, recipe.num_clients), size=k - 1, replace=False)
        return sorted([0, *others.tolist()])
    return sorted(rng.choice(recipe.num_clients, size=k, replace=False).tolist())


def choose_peers(candidates: Sequence[str], count: int | None, seed: int) -> list[str]:
    """``count`` peers (all when None or more than there are) drawn from ``candidates``, sorted."""
    if count is None or count >= len(candidates):
        return sorted(candidates)
    rng = np.random.default_rng(seed)
    return sorted(rng.choice(sorted(candidates), size=count, replace=False).tolist())


# ----------------------------------------------------------------------------------------------------------
# Records


@dataclass
class PairRecord:
    client: str
    peer: str
    strategy: str | None
    """Attack spec of an attacker submission; None for an honest client scored against its peers."""
    payment: float
    delta: list[list[float]]
    """Empirical 2x2 delta matrix over (negative, non-negative) reports."""
    categorical_world: bool
    honest_pair: bool = True
    """Both sides are honest updates (no attack submission, no fixed attacker)."""


@dataclass
class RoundRecord:
    round: int
    learning_rate: float
    clients: list[str]
    attacker: str | None
    kfca_seed: int
    rewards: dict[str, float]
    """Attack spec -> reward of the attacker's submission (mean over its peers)."""
    honest_rewards: dict[str, float]
    """Honest client id -> reward against the other clients' honest updates."""
    pairs: list[PairRecord]
    categorical_world: bool
    """Every pair of honest updates scored this round satisfies the categorical-world condition."""
    loss_before: dict[str, float]
    loss_after: dict[str, float]
    num_examples: dict[str, int]
    attacker_rewards: dict[str, float] = field(default_factory=dict)
    """Fixed attacker id -> reward of what it submitted, against its peers."""
    fixed_attacks: dict[str, str] = field(default_factory=dict)
    """Fixed attackers of this round: client id -> attack spec."""

    def honest_delta(self) -> list[list[float]]:
        """Mean empirical delta matrix over the round's pairs of honest updates."""
        deltas = [p.delta for p in self.pairs if p.honest_pair]
        return np.mean(np.asarray(deltas, dtype=float), axis=0).tolist()

    @staticmethod
    def from_dict(d: Mapping[str, Any]) -> RoundRecord:
        d = dict(d)
        d["pairs"] = [PairRecord(**p) for p in d["pairs"]]
        return RoundRecord(**d)


@dataclass
class FederationResult:
    recipe: Recipe
    seed: int
    strategies: list[str]
    rounds: list[RoundRecord] = field(default_factory=list)

    def mean_rewards(self) -> dict[str, float]:
        """Attack spec -> mean reward over rounds."""
        return {s: float(np.mean([r.rewards[s] for r in self.rounds])) for s in self.strategies}

    def mean_honest_reward(self) -> float:
        values = [v for r in self.rounds for v in r.honest_rewards.values()]
        return float(np.mean(values)) if values else math.nan

    def fixed_attackers(self) -> dict[str, dict[str, Any]]:
        """Fixed attacker id -> spec, mean reward and per-round rewards (None where not sampled)."""
        specs = {cid: spec for r in self.rounds for cid, spec in r.fixed_attacks.items()}
        out = {}
        for cid, spec in sorted(specs.items()):
            per_round = [r.attacker_rewards.get(cid) for r in self.rounds]
            seen = [v for v in per_round if v is not None]
            out[cid] = {"spec": spec, "mean_reward": float(np.mean(seen)) if seen else math.nan,
                        "per_round": per_round}
        return out

    def to_report(self) -> dict[str, Any]:
        return {
            "domain": self.recipe.domain,
            "recipe": self.recipe.name,
            "seed": self.seed,
            "rounds": len(self.rounds),
            "strategies": {s: {"mean_reward": m, "per_round": [r.rewards[s] for r in self.rounds]}
                           for s, m in self.mean_rewards().items()},
            "honest_clients": {"mean_reward": self.mean_honest_reward(),
                               "per_round": [r.honest_rewards for r in self.rounds]},
            "fixed_attackers": self.fixed_attackers(),
            "categorical_world": [r.categorical_world for r in self.rounds],
            "delta": [r.honest_delta() for r in self.rounds],
            "round_records": [asdict(r) for r in self.rounds],
            "config": recipe_to_dict(self.recipe),
        }


# ----------------------------------------------------------------------------------------------------------
# Local training


@dataclass(frozen=True)
class LocalResult:
    update: StateDict
    num_examples: int
    loss_before: float
    loss_after: float


def local_steps(recipe: Recipe, num_examples: int) -> int:
    """Optimizer steps per round: ``max-steps`` when positive (it caps the epochs, as in Hugging Face)."""
    ta = recipe.train.training_arguments
    if ta.max_steps > 0:
        return ta.max_steps
    per_step = ta.per_device_train_batch_size * ta.gradient_accumulation_steps
    return max(1, math.ceil(num_examples / per_step)) * ta.num_train_epochs


def _example_order(num_examples: int, count: int, g: torch.Generator) -> list[int]:
    """``count`` example indices: seeded reshuffled epochs, concatenated (each epoch sees every example)."""
    order: list[int] = []
    while len(order) < count:
        order.extend(torch.randperm(num_examples, generator=g).tolist())
    return order[:count]


def _make_optimizer(params: list[torch.nn.Parameter], lr: float, recipe: Recipe, device: torch.device):
    # The FlowerTune winners used paged 8-bit AdamW; it needs bitsandbytes on a CUDA device.
    paged = recipe.model.quantization is not None or recipe.train.training_arguments.optim == "paged_adamw_8bit"
    if device.type == "cuda" and paged:
        import bitsandbytes as bnb

        return bnb.optim.PagedAdamW8bit(params, lr=lr, weight_decay=0.0)
    return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)


def _batch_loss(model, batch: Sequence[Mapping[str, Any]], pad_token_id: int, device: torch.device) -> torch.Tensor:
    from .data import collate

    tensors = {k: v.to(device) for k, v in collate(batch, pad_token_id).items()}
    return model(**tensors).loss


def _probe_loss(model, batch, pad_token_id: int, device: torch.device) -> float:
    was_training = model.training
    model.eval()
    with torch.no_grad():
        loss = float(_batch_loss(model, batch, pad_token_id, device))
    model.train(was_training)
    return loss


def adapter_state(model) -> StateDict:
    """The adapter's trainable state (float32 copies on the CPU)."""
    from peft import get_peft_model_state_dict

    state = get_peft_model_state_dict(model)
    # Sorted names: the same order as a safetensors file read back on resume.
    return {k: state[k].detach().to("cpu", torch.float32).clone() for k in sorted(state)}


def load_adapter_state(model, state: Mapping[str, torch.Tensor]) -> None:
    from peft import set_peft_model_state_dict

    result = set_peft_model_state_dict(model, dict(state))
    unexpected = getattr(result, "unexpected_keys", None)
    if unexpected:
        raise InputError(f"adapter state has tensors the model lacks: {unexpected[:5]}")


def train_client(model, global_state: Mapping[str, torch.Tensor], examples: Sequence[Mapping[str, Any]],
                 recipe: Recipe, *, lr: float, seed: int, device: torch.device, pad_token_id: int,
                 step_callback: Callable[[], None] | None = None) -> LocalResult:
    """Train one client from the global adapter; returns ``local - global`` and the probe losses.

    The probe batch (first optimizer step's examples) gives the loss before and after training, in
    eval mode, so both numbers are comparable."""
    if not examples:
        raise InputError("a client has no training examples")
    ta = recipe.train.training_arguments
    load_adapter_state(model, global_state)
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(derive_seed(seed, 0))  # dropout: the same for this client on any process
    steps = local_steps(recipe, len(examples))
    micro = ta.per_device_train_batch_size
    per_step = micro * ta.gradient_accumulation_steps
    order = _example_order(len(examples), steps * per_step, g)
    probe = [examples[i] for i in order[:per_step]]
    loss_before = _probe_loss(model, probe, pad_token_id, device)

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _make_optimizer(params, lr, recipe, device)
    model.train()
    for step in range(steps):
        chunk = order[step * per_step:(step + 1) * per_step]
        optimizer.zero_grad(set_to_none=True)
        for start in range(0, per_step, micro):
            batch = [examples[i] for i in chunk[start:start + micro]]
            loss = _batch_loss(model, batch, pad_token_id, device) / ta.gradient_accumulation_steps
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        optimizer.step()
        if step_callback is not None:
            step_callback()
    loss_after = _probe_loss(model, probe, pad_token_id, device)
    local = adapter_state(model)
    update = {k: local[k] - global_state[k] for k in global_state}
    return LocalResult(update, len(examples), loss_before, loss_after)


def fedavg(global_state: Mapping[str, torch.Tensor], updates: Sequence[tuple[str, Mapping[str, torch.Tensor], int]]
           ) -> StateDict:
    """``global + sum_i n_i update_i / sum_i n_i``, summed in sorted id order (reproducible bit for bit)."""
    total = sum(n for _, _, n in updates)
    if total <= 0:
        raise InputError("FedAvg needs at least one update with examples")
    out = {}
    for name, g in global_state.items():
        acc = torch.zeros_like(g, dtype=torch.float32)
        for _, upd, n in sorted(updates, key=lambda item: item[0]):
            acc += upd[name].float() * (n / total)
        out[name] = (g.float() + acc).to(g.dtype)
    return out


# ----------------------------------------------------------------------------------------------------------
# Processes


class _Processes:
    """This process's rank in an ``accelerate launch`` run (or a single process)."""

    def __init__(self, cpu: bool):
        from accelerate import PartialState

        self.state = PartialState(cpu=cpu)
        self.count = self.state.num_processes
        self.index = self.state.process_index
        self.device = torch.device(self.state.device)

    @property
    def is_main(self) -> bool:
        return self.index == 0

    def owns(self, position: int) -> bool:
        return position % self.count == self.index

    def gather(self, obj: Any) -> list[Any]:
        if self.count == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] = [None] * self.count
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        if self.count == 1:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        if self.count > 1:
            self.state.wait_for_everyone()


# ----------------------------------------------------------------------------------------------------------
# Checkpoints


def round_dir(out_dir: Path, t: int) -> Path:
    return out_dir / "adapters" / f"round-{t:03d}"


def _save_checkpoint(out_dir: Path, t: int, model, global_state: StateDict, histories: dict[str, list[StateDict]],
                     result: FederationResult) -> None:
    """Adapter in PEFT's format, plus what a resume needs (attackers' histories, records), then a marker."""
    from safetensors.torch import save_file

    load_adapter_state(model, global_state)
    final = round_dir(out_dir, t)
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
    state = out_dir / "state" / f"round-{t:03d}"
    state.mkdir(parents=True, exist_ok=True)
    tensors = {f"{cid}/{r + 1:03d}/{name}": v.contiguous()
               for cid, history in histories.items() for r, h in enumerate(history) for name, v in h.items()}
    save_file(tensors, str(state / "history.safetensors"))
    write_atomic(state / "records.json", json.dumps(
        {"seed": result.seed, "strategies": result.strategies, "rounds": [asdict(r) for r in result.rounds]}))
    if final.exists():
        import shutil

        shutil.rmtree(final)
    os.replace(tmp, final)
    write_atomic(state / "COMPLETE", str(t))  # written last: a resume trusts only complete rounds


def last_complete_round(out_dir: Path) -> int:
    """Latest round with a saved adapter and resume state (0 when none)."""
    state = out_dir / "state"
    done = [int(m.group(1)) for p in state.glob("round-*") if (m := _ROUND_DIR.match(p.name))
            and (p / "COMPLETE").exists() and round_dir(out_dir, int(m.group(1))).is_dir()] if state.is_dir() else []
    return max(done, default=0)


def _load_checkpoint(out_dir: Path, t: int, recipe: Recipe, seed: int, strategies: list[str]
                     ) -> tuple[StateDict, dict[str, list[StateDict]], list[RoundRecord]]:
    from safetensors.torch import load_file

    records = json.loads((out_dir / "state" / f"round-{t:03d}" / "records.json").read_text())
    if records["seed"] != seed or records["strategies"] != strategies:
        raise InputError(f"cannot resume from {out_dir}: it was run with seed {records['seed']} and strategies "
                         f"{records['strategies']}, this run has seed {seed} and {strategies}")
    flat = load_file(str(out_dir / "state" / f"round-{t:03d}" / "history.safetensors"))
    by_client: dict[str, dict[int, StateDict]] = {}
    for key, v in flat.items():
        cid, r, name = key.split("/", 2)
        by_client.setdefault(cid, {}).setdefault(int(r), {})[name] = v
    histories = {cid: [rounds[r] for r in sorted(rounds)] for cid, rounds in by_client.items()}
    adapter = load_file(str(round_dir(out_dir, t) / "adapter_model.safetensors"))
    return adapter, histories, [RoundRecord.from_dict(d) for d in records["rounds"]]


# ----------------------------------------------------------------------------------------------------------
# The federation


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


def _round_kfca_seed(seed: int, t: int) -> int:
    return derive_seed(seed, _KFCA, t)


def _attack_generator(seed: int, t: int, spec: str) -> torch.Generator:
    # Keyed by the spec text, so a strategy draws the same noise whatever else is listed.
    return torch.Generator().manual_seed(derive_seed(seed, _ATTACK, t, zlib.crc32(spec.encode())))


def _score_round(recipe: Recipe, kfca_seed: int, seen: Mapping[str, StateDict], attacker: str | None,
                 submissions: Mapping[str, StateDict], attacks: Sequence[Attack], fixed: Mapping[str, str]):
    """One score_updates call on one task partition.

    ``seen`` is what each client of the round submitted (a fixed attacker's attack, else its honest
    update): every client except the analysis attacker is scored against its peers among them. The
    analysis attacker's submissions are each scored against the same honest peers.
    """
    from . import score_updates

    ids = sorted(seen)
    pairs: list[tuple[str, str]] = []
    meta: dict[tuple[str, str], tuple[str | None, bool]] = {}
    for position, cid in enumerate(ids):
        if cid == attacker:
            continue
        for peer in choose_peers([c for c in ids if c != cid], recipe.kfca.peers, derive_seed(kfca_seed, position)):
            pairs.append((cid, peer))
            meta[(cid, peer)] = (None, cid not in fixed and peer not in fixed)
    if attacker is not None:
        others = [c for c in ids if c != attacker]
        honest_others = [c for c in others if c not in fixed] or others
        peers = choose_peers(honest_others, recipe.kfca.peers, derive_seed(kfca_seed, ids.index(attacker)))
        for a in attacks:
            for peer in peers:
                pairs.append((submission_id(attacker, a.spec), peer))
                meta[pairs[-1]] = (a.spec, a.spec == "honest" and peer not in fixed)
    updates: dict[str, StateDict] = dict(seen)
    updates.update({submission_id(attacker, s): u for s, u in submissions.items() if s != "honest"})
    report = score_updates(updates, pairs=pairs, seed=kfca_seed, penalty=recipe.kfca.penalty,
                           bonus_fraction=recipe.kfca.bonus_fraction)
    records = [PairRecord(client=c, peer=p, strategy=meta[(c, p)][0], payment=float(report.pairwise[(c, p)]),
                          delta=np.asarray(report.pair_delta[(c, p)], dtype=float).tolist(),
                          categorical_world=bool(report.pair_categorical_world[(c, p)]),
                          honest_pair=meta[(c, p)][1]) for c, p in pairs]

    def mean_payment(client: str, strategy: str | None) -> float:
        return float(np.mean([r.payment for r in records if r.client == client and r.strategy == strategy]))

    rewards = {a.spec: mean_payment(submission_id(attacker, a.spec), a.spec) for a in attacks}
    honest_rewards = {cid: mean_payment(cid, None) for cid in ids if cid != attacker and cid not in fixed}
    if attacker is not None and "honest" in rewards:
        honest_rewards[attacker] = rewards["honest"]
    attacker_rewards = {cid: mean_payment(cid, None) for cid in ids if cid in fixed}
    categorical = all(r.categorical_world for r in records if r.honest_pair)
    return rewards, honest_rewards, attacker_rewards, records, categorical


def run_federation(recipe: Recipe, options: FederationOptions = FederationOptions()) -> FederationResult:
    """Run KFCA-FedAvg for ``recipe.num_server_rounds`` rounds; see the module docstring."""
    from tqdm.auto import tqdm

    from .data import load_client_datasets
    from .modeling import load_model_and_tokenizer

    procs = _Processes(cpu=options.cpu)
    seed = recipe.kfca.seed
    attacks = resolve_attacks(recipe.kfca.attacks)
    strategies = [a.spec for a in attacks]
    attacker = client_id(0) if attacks else None
    fixed = {client_id(i): resolve_attack(spec) for i, spec in fixed_attackers(recipe).items()}
    result = FederationResult(recipe, seed, strategies)

    model, tokenizer = load_model_and_tokenizer(recipe, device=procs.device, model_dir=options.model_dir)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    datasets = load_client_datasets(recipe, tokenizer, data_dir=options.data_dir)
    # One initial adapter for all processes (a real model's LoRA init draws from each process's RNG).
    global_state: StateDict = procs.broadcast(adapter_state(model))
    # Each attacking client's own honest updates, oldest first (what stale and lagged:K replay).
    histories: dict[str, list[StateDict]] = {cid: [] for cid in ([attacker] if attacker else []) + sorted(fixed)}
    start = 1
    out_dir = Path(options.out_dir) if options.out_dir is not None else None
    if options.resume:
        if out_dir is None:
            raise InputError("--resume needs an output folder")
        done = last_complete_round(out_dir)
        if done:
            global_state, saved, result.rounds = _load_checkpoint(out_dir, done, recipe, seed, strategies)
            histories.update(saved)
            start = done + 1

    T = recipe.num_server_rounds
    show = options.progress and procs.is_main
    rounds_bar = tqdm(total=T, initial=start - 1, desc="rounds", unit="round", disable=not show)
    for t in range(start, T + 1):
        lr = lr_for_round(recipe, t)
        indices = sample_round_clients(recipe, t, seed)
        ids = [client_id(i) for i in indices]
        mine = [(i, cid) for pos, (i, cid) in enumerate(zip(indices, ids)) if procs.owns(pos)]
        steps_total = sum(local_steps(recipe, len(datasets[i])) for i, _ in mine)
        steps_bar = tqdm(total=steps_total, desc=f"round {t} local steps", unit="step", leave=False,
                         disable=not show)
        local: dict[str, LocalResult] = {}
        for i, cid in mine:
            local[cid] = train_client(model, global_state, datasets[i], recipe, lr=lr,
                                      seed=derive_seed(seed, _TRAIN, t, i), device=procs.device,
                                      pad_token_id=pad_id, step_callback=lambda: steps_bar.update(1))
        steps_bar.close()
        for part in procs.gather(local):
            local.update(part)
        honest = {cid: local[cid].update for cid in ids}
        round_fixed = {cid: fixed[cid] for cid in ids if cid in fixed}
        seen = dict(honest)
        for cid, attack in round_fixed.items():
            seen[cid] = attack(honest[cid], histories[cid], _attack_generator(seed, t, f"{cid}={attack.spec}"))

        submissions: dict[str, StateDict] = {}
        if attacker is not None:
            submissions = {a.spec: a(honest[attacker], histories[attacker], _attack_generator(seed, t, a.spec))
                           for a in attacks}
        kfca_seed = _round_kfca_seed(seed, t)
        rewards, honest_rewards, attacker_rewards, pairs, categorical = _score_round(
            recipe, kfca_seed, seen, attacker, submissions, attacks, {c: a.spec for c, a in round_fixed.items()})
        aggregated = seen if recipe.kfca.aggregate == "all" else honest
        contributions = [(cid, aggregated[cid], local[cid].num_examples) for cid in ids]
        if recipe.kfca.aggregate == "all" and attacker is not None:
            n_att = local[attacker].num_examples
            contributions += [(submission_id(attacker, s), u, n_att) for s, u in submissions.items() if s != "honest"]
        global_state = fedavg(global_state, contributions)
        for cid, history in histories.items():
            if cid in honest:
                history.append(honest[cid])

        result.rounds.append(RoundRecord(
            round=t, learning_rate=lr, clients=ids, attacker=attacker, kfca_seed=kfca_seed, rewards=rewards,
            honest_rewards=honest_rewards, pairs=pairs, categorical_world=categorical,
            loss_before={c: local[c].loss_before for c in ids}, loss_after={c: local[c].loss_after for c in ids},
            num_examples={c: local[c].num_examples for c in ids}, attacker_rewards=attacker_rewards,
            fixed_attacks={c: a.spec for c, a in round_fixed.items()}))
        if out_dir is not None and procs.is_main and (t % max(recipe.train.save_every_round, 1) == 0 or t == T):
            _save_checkpoint(out_dir, t, model, global_state, histories, result)
        procs.barrier()
        rounds_bar.update(1)
        if show:
            rounds_bar.set_postfix({s: f"{v:+.3f}" for s, v in list(rewards.items())[:3]})
    rounds_bar.close()
    load_adapter_state(model, global_state)
    return result
