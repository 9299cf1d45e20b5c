"""What a federation keeps on disk: global adapters (PEFT format), clients' round updates, resume state.

``<out>/adapters/round-XXX/``: the global adapter after round XXX, every ``train.save-every-round``
rounds and at the end. With ``train.save-client-updates``: ``<out>/updates/round-XXX/global/`` (the
adapter the round started from) and ``<out>/updates/round-XXX/client-YYY/`` (that global plus what
client YYY submitted), so ``kfca_llm.score_checkpoints(clients, reference=global)`` scores the round.
``<out>/state/round-XXX/``: the attackers' histories and the records (and, where free riders are listed,
the newest globals each attacker received), then ``COMPLETE`` (written last).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from ..errors import InputError
from ..report import write_atomic
from ..tensors import StateDict
from .client import load_adapter_state
from ..recipe import Recipe
from .peer_pool import PeerPool, PoolSettings
from .pool_settings import POOL_KEYS
from .pool_settle import pending_from_arrays, pending_to_arrays
from .records import FederationResult, RoundRecord

_ROUND_DIR = re.compile(r"^round-(\d{3,})$")


def round_dir(out_dir: Path, t: int) -> Path:
    return out_dir / "adapters" / f"round-{t:03d}"


def updates_dir(out_dir: Path, t: int) -> Path:
    return out_dir / "updates" / f"round-{t:03d}"


def save_adapter(model, state: Mapping[str, torch.Tensor], final: Path) -> None:
    """``state`` as a PEFT adapter directory, replaced atomically."""
    load_adapter_state(model, state)
    tmp = final.with_name(f".{final.name}.tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


def save_client_updates(out_dir: Path, t: int, model, start_state: Mapping[str, torch.Tensor],
                        submitted: Mapping[str, Mapping[str, torch.Tensor]]) -> None:
    """The round's starting global adapter and, per client, that adapter plus its submission."""
    folder = updates_dir(out_dir, t)
    folder.mkdir(parents=True, exist_ok=True)
    save_adapter(model, start_state, folder / "global")
    for cid, update in sorted(submitted.items()):
        save_adapter(model, {k: start_state[k] + update[k] for k in start_state}, folder / cid)


def save_checkpoint(out_dir: Path, t: int, model, global_state: StateDict,
                    histories: Mapping[str, Sequence[StateDict]], result: FederationResult,
                    publics: Mapping[str, Sequence[StateDict]] | None = None) -> None:
    """Global adapter in PEFT's format, plus what a resume needs (histories, records, the attackers' received
    globals where ``publics`` is given), then a marker."""
    from safetensors.torch import save_file

    state = out_dir / "state" / f"round-{t:03d}"
    state.mkdir(parents=True, exist_ok=True)
    tensors = {f"{cid}/{r + 1:03d}/{name}": v.contiguous()
               for cid, history in histories.items() for r, h in enumerate(history) for name, v in h.items()}
    save_file(tensors, str(state / "history.safetensors"))
    if publics:
        # Clients received the same globals: each is stored once, the clients' lists name them by index.
        stored: dict[int, tuple[int, StateDict]] = {}
        received = {cid: [stored.setdefault(id(g), (len(stored), g))[0] for g in listed]
                    for cid, listed in publics.items()}
        save_file({f"{i:03d}/{name}": v.contiguous() for i, g in stored.values() for name, v in g.items()},
                  str(state / "public.safetensors"), metadata={"received": json.dumps(received)})
    write_atomic(state / "records.json", json.dumps(
        {"seed": result.seed, "strategies": result.strategies, "scoring": resume_settings(result.recipe),
         "rounds": [asdict(r) for r in result.rounds]}))
    round_dir(out_dir, t).parent.mkdir(parents=True, exist_ok=True)
    save_adapter(model, global_state, round_dir(out_dir, t))
    write_atomic(state / "COMPLETE", str(t))  # written last: a resume trusts only complete rounds


def save_pool(out_dir: Path, t: int, pool: PeerPool) -> None:
    """The peer pool after round ``t`` (sign words and sketches), beside that round's resume state."""
    from safetensors.numpy import save

    arrays, metadata = pool.to_arrays()
    pending, records = pending_to_arrays(pool)
    arrays, metadata = {**arrays, **pending}, {**metadata, "pending": records}
    state = out_dir / "state" / f"round-{t:03d}"
    state.mkdir(parents=True, exist_ok=True)
    write_atomic(state / "pool.safetensors", save(arrays, metadata=metadata))


def load_pool(out_dir: Path, t: int, settings: PoolSettings) -> PeerPool:
    """The pool ``save_pool`` kept after round ``t`` (an empty one where the checkpoint has none)."""
    from safetensors import safe_open

    path = out_dir / "state" / f"round-{t:03d}" / "pool.safetensors"
    if not path.is_file():
        return PeerPool(settings)
    with safe_open(str(path), framework="numpy") as f:
        arrays, metadata = {k: f.get_tensor(k) for k in f.keys()}, f.metadata() or {}
    pool = PeerPool.from_arrays(settings, arrays, metadata)
    pool.pending = pending_from_arrays(arrays, metadata.get("pending", "[]"))
    return pool


def last_complete_round(out_dir: Path) -> int:
    """Latest round with a saved adapter and resume state (0 when none)."""
    state = out_dir / "state"
    if not state.is_dir():
        return 0
    done = [int(m.group(1)) for p in state.glob("round-*") if (m := _ROUND_DIR.match(p.name))
            and (p / "COMPLETE").exists() and round_dir(out_dir, int(m.group(1))).is_dir()]
    return max(done, default=0)


def resume_settings(recipe: Recipe) -> dict:
    """The recipe's keys that decide payments, as a checkpoint records them (``records.json``'s ``scoring``): a
    resumed run must have the interrupted run's. Recipe keys, not the ledger's record of a ``KFCAStrategy`` run
    (``flower.recompute.scoring_settings``): a checkpoint of an earlier version resumes only if they stay so."""
    k = recipe.kfca
    return {"kfca.peers": k.peers, "kfca.penalty": k.penalty, "kfca.bonus-fraction": k.bonus_fraction,
            "kfca.duplicates": k.duplicates, "kfca.aggregate": k.aggregate, "kfca.attackers": list(k.attackers),
            **{"kfca." + key.argument.replace("_", "-"): getattr(k, key.argument) for key in POOL_KEYS.values()},
            # Only when on: checkpoints of runs before the reference existed resume as they did.
            **({"kfca.reference-rows": k.reference_rows, "kfca.reference-weight": k.reference_weight}
               if k.reference_rows else {}),
            # Only when on, likewise (kfca_llm.engine.public).
            **({"kfca.public-steps": k.public_steps, "kfca.public-buckets": k.public_buckets} if k.public_steps else {})}


def load_checkpoint(out_dir: Path, t: int, seed: int, strategies: list[str], recipe: Recipe,
                    shapes: Mapping[str, tuple[int, ...]] | None = None
                    ) -> tuple[StateDict, dict[str, list[StateDict]], list[RoundRecord]]:
    """Global adapter, attackers' histories and records saved after round ``t``; ``InputError`` naming the
    first setting (seed, strategies, scoring settings) in which ``recipe`` differs from the interrupted run,
    or the damaged file (truncated, not what it should hold, a tensor not of the model's ``shapes``) and how to
    go on."""
    state = out_dir / "state" / f"round-{t:03d}"
    records_path, history_path = state / "records.json", state / "history.safetensors"
    adapter_path = round_dir(out_dir, t) / "adapter_model.safetensors"

    def damaged(path: Path, why: str) -> InputError:
        return InputError(f"cannot resume from {out_dir}: {path} is damaged ({why}); delete {state} to resume "
                          f"from the round before it, or run without --resume into a new --out")

    try:
        records = json.loads(records_path.read_text(encoding="utf-8"))
        run_seed, run_strategies = records["seed"], records["strategies"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise damaged(records_path, str(exc)[:200]) from None
    if run_seed != seed or run_strategies != strategies:
        raise InputError(f"cannot resume from {out_dir}: it was run with seed {run_seed} and strategies "
                         f"{run_strategies}, this run has seed {seed} and {strategies}")
    saved, now = records.get("scoring"), resume_settings(recipe)
    if saved is None:
        raise InputError(f"cannot resume from {out_dir}: its checkpoint does not record its scoring settings "
                         "(written by an older kfca-llm); start a new run")
    for key in now:
        if saved.get(key) != now[key]:
            raise InputError(f"cannot resume from {out_dir}: scoring setting {key} was {saved.get(key)!r} in the "
                             f"interrupted run, this run has {now[key]!r}")
    try:
        rounds = [RoundRecord.from_dict(d) for d in records["rounds"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise damaged(records_path, f"a round record: {str(exc)[:200]}") from None
    adapter = _tensors(adapter_path, damaged)
    histories: dict[str, dict[int, StateDict]] = {}
    for key, v in _tensors(history_path, damaged).items():
        cid, r, name = (key.split("/", 2) + ["", ""])[:3]
        if not r.isdigit() or not name:
            raise damaged(history_path, f"tensor {key!r} is not named client/round/tensor")
        histories.setdefault(cid, {}).setdefault(int(r), {})[name] = v
    if shapes is not None:
        for path, tensors in [(adapter_path, adapter)] + [(history_path, h) for c in histories.values()
                                                            for h in c.values()]:
            if set(tensors) - set(shapes):
                raise damaged(path, f"tensors the model lacks: {sorted(set(tensors) - set(shapes))[:3]}")
            wrong = [n for n, v in tensors.items() if tuple(v.shape) != tuple(shapes[n])]
            if wrong:
                raise damaged(path, f"tensor {wrong[0]!r} has shape {tuple(tensors[wrong[0]].shape)}, the model's "
                                    f"adapter {tuple(shapes[wrong[0]])}")
        if set(shapes) - set(adapter):
            raise damaged(adapter_path, f"tensors missing: {sorted(set(shapes) - set(adapter))[:3]}")
    return adapter, {cid: [rs[r] for r in sorted(rs)] for cid, rs in histories.items()}, rounds


def load_publics(out_dir: Path, t: int) -> dict[str, list[StateDict]]:
    """The globals each attacking client had received, as ``save_checkpoint`` kept them after round ``t``."""
    path = out_dir / "state" / f"round-{t:03d}" / "public.safetensors"
    if not path.is_file():
        raise InputError(f"cannot resume from {out_dir}: {path} is missing (a free rider reads the globals its "
                         "client received); run without --resume into a new --out")
    from safetensors import safe_open

    def damaged(why: str) -> InputError:
        return InputError(f"cannot resume from {out_dir}: {path} is damaged ({why}); run without --resume "
                          "into a new --out")

    tensors = _tensors(path, lambda _, why: damaged(why))
    try:
        stored: dict[int, StateDict] = {}
        for key, v in tensors.items():
            index, name = key.split("/", 1)
            stored.setdefault(int(index), {})[name] = v
        with safe_open(str(path), framework="pt") as f:
            received = json.loads((f.metadata() or {})["received"])
        return {cid: [stored[i] for i in listed] for cid, listed in received.items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise damaged(str(exc)[:200]) from None


def _tensors(path: Path, damaged) -> StateDict:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (OSError, SafetensorError, ValueError) as exc:
        raise damaged(path, str(exc)[:200]) from None
