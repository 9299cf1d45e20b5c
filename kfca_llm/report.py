"""Reward reports: what a scoring call returns, as objects, JSON and readable tables."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .engine.duplicates import DuplicateGroup, apply_duplicate_policy
from .engine.stats import PairPayment, delta_from_joint, deltas_from_joints
from .errors import InputError
from .mechanism import categorical_world
from .text import printable, text_table

Pair = tuple[str, str]


@dataclass(frozen=True)
class RewardReport:
    """Rewards of one scoring round.

    ``rewards[c]`` is client c's mean MTPP payment over its scored peers; ``pairwise[(c, p)]`` the
    payment of c against peer p, split into ``bonus_agreement`` minus ``penalty_agreement``.
    ``delta`` pools the joint report counts of all scored pairs (labels in ``labels`` order).
    """

    rewards: dict[str, float]
    pairwise: dict[Pair, float]
    bonus_agreement: dict[Pair, float]
    penalty_agreement: dict[Pair, float]
    pair_delta: dict[Pair, np.ndarray]
    delta: np.ndarray
    seed: int
    penalty: str
    bonus_fraction: float
    backend: str
    labels: tuple[str, ...]
    tasks: dict[str, int] = field(default_factory=dict)
    duplicates: tuple[DuplicateGroup, ...] = ()
    """Groups of clients whose reports are copies of each other (``engine.duplicates``)."""
    duplicate_policy: str = "zero"
    """How ``rewards`` treat those groups: zero (paid nothing), split (one reward shared), flag (unchanged)."""
    unadjusted_rewards: dict[str, float] = field(default_factory=dict)
    """Rewards before the duplicate policy (equal to ``rewards`` under ``flag``)."""
    warnings: tuple[str, ...] = ()
    """What the scorer found suspect in its inputs (``score_checkpoints``: full adapters without a reference)."""

    @classmethod
    def from_pairs(cls, terms: Mapping[Pair, PairPayment], joints: Mapping[Pair, np.ndarray], *,
                   duplicates: tuple[DuplicateGroup, ...] = (), duplicate_policy: str = "zero",
                   **meta) -> "RewardReport":
        """Assemble a report from each scored pair's payment terms and joint report counts."""
        per_client: dict[str, list[float]] = {}
        for (client, _), t in terms.items():
            per_client.setdefault(client, []).append(t.payment)
        rewards = {c: float(np.mean(v)) for c, v in sorted(per_client.items())}
        stacked = np.stack(list(joints.values()))  # one array op for all pairs' deltas
        return cls(
            rewards=apply_duplicate_policy(rewards, duplicates, duplicate_policy),
            unadjusted_rewards=rewards, duplicates=tuple(duplicates), duplicate_policy=duplicate_policy,
            pairwise={k: t.payment for k, t in terms.items()},
            bonus_agreement={k: t.bonus_agreement for k, t in terms.items()},
            penalty_agreement={k: t.penalty_agreement for k, t in terms.items()},
            pair_delta=dict(zip(joints, deltas_from_joints(stacked))),
            delta=delta_from_joint(stacked.sum(axis=0)),
            **meta,
        )

    @property
    def categorical_world(self) -> bool:
        return categorical_world(self.delta)

    @property
    def pair_categorical_world(self) -> dict[Pair, bool]:
        return {pair: categorical_world(d) for pair, d in self.pair_delta.items()}

    @property
    def peers(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for client, peer in self.pairwise:
            out.setdefault(client, []).append(peer)
        return out

    def ranking(self) -> list[tuple[str, float]]:
        return sorted(self.rewards.items(), key=lambda item: (-item[1], item[0]))

    def to_dict(self) -> dict:
        """JSON-serialisable form (pairs as records, matrices as nested lists)."""
        return {
            "rewards": dict(self.rewards),
            "pairwise": [
                {"client": c, "peer": p, "payment": v, "bonus_agreement": self.bonus_agreement[(c, p)],
                 "penalty_agreement": self.penalty_agreement[(c, p)],
                 "delta": self.pair_delta[(c, p)].tolist(),
                 "categorical_world": categorical_world(self.pair_delta[(c, p)])}
                for (c, p), v in self.pairwise.items()
            ],
            "delta": self.delta.tolist(),
            "categorical_world": self.categorical_world,
            "labels": list(self.labels),
            "seed": self.seed,
            "penalty": self.penalty,
            "bonus_fraction": self.bonus_fraction,
            "backend": self.backend,
            "tasks": dict(self.tasks),
            "duplicate_policy": self.duplicate_policy,
            "duplicates": [g.to_dict() for g in self.duplicates],
            "unadjusted_rewards": dict(self.unadjusted_rewards),
            "warnings": list(self.warnings),
        }

    def table(self) -> str:
        peers = self.peers
        group_of = {c: k for k, g in enumerate(self.duplicates, start=1) for c in g.clients}
        rows = []
        for rank, (client, reward) in enumerate(self.ranking(), start=1):
            mine = [(client, p) for p in peers.get(client, [])]
            bonus = np.mean([self.bonus_agreement[k] for k in mine])
            penalty = np.mean([self.penalty_agreement[k] for k in mine])
            rows.append((str(rank), client, f"{reward:+.4f}", str(len(mine)), f"{bonus:.4f}", f"{penalty:.4f}",
                         f"#{group_of[client]}" if client in group_of else ""))
        delta = np.array2string(self.delta, precision=5, suppress_small=False)
        notes = [f"pooled delta matrix (labels {', '.join(self.labels)}):\n{delta}\n"
                 f"categorical-world condition: {'holds' if self.categorical_world else 'VIOLATED'}"]
        if self.tasks:
            notes.append("tasks: " + ", ".join(f"{k} {v}" for k, v in self.tasks.items()))
        action = {"flag": "rewards unchanged", "split": "each group paid as one client",
                  "zero": "groups paid nothing"}[self.duplicate_policy]
        for k, group in enumerate(self.duplicates, start=1):
            pairs = "; ".join(f"{printable(p.client)} ~ {printable(p.peer)}: {p.reason}, agreement {p.agreement:.4f}"
                              for p in group.pairs)
            unadjusted = ", ".join(f"{printable(c)} {self.unadjusted_rewards[c]:+.4f}" for c in group.clients
                                   if c in self.unadjusted_rewards)
            notes.append(f"copies #{k} ({action}): {', '.join(map(printable, group.clients))} ({pairs}); "
                         f"unadjusted rewards: {unadjusted}")
        notes += [f"WARNING: {printable(w)}" for w in self.warnings]
        return text_table(f"KFCA rewards (seed {self.seed}, penalty {self.penalty}, backend {self.backend})",
                          ["rank", "client", "reward", "peers", "bonus agree", "penalty agree", "copies"], rows, notes)

    def __str__(self) -> str:
        return self.table()


def write_atomic(path: str | os.PathLike, text: str | bytes) -> Path:
    """Write a file so that readers see either the old or the new content, never a torn one."""
    path = check_output_path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = text.encode() if isinstance(text, str) else text
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; a written file follows the umask like any tool's
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def check_output_path(path: str | os.PathLike) -> Path:
    """An output file path that may be (re)written: absent or a regular file, never a directory or device."""
    path = Path(path)
    if path.exists() and not path.is_file():
        raise InputError(f"output {path} exists and is not a regular file; refusing to replace it")
    _check_folders_above(path)
    return path


def check_output_dir(path: str | os.PathLike) -> Path:
    """An output folder that may be created or written into: absent or a directory, below directories only
    (checked before the work, not when its first file is written)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise InputError(f"output folder {path} exists and is not a directory")
    _check_folders_above(path)
    return path


def _check_folders_above(path: Path) -> None:
    """The nearest existing folder above ``path`` must be a directory: a file there would fail the write."""
    for above in path.parents:
        if above.is_symlink() and not above.exists():
            raise InputError(f"output {path}: {above} is a broken link")
        if above.exists():
            if not above.is_dir():
                raise InputError(f"output {path}: {above} is not a directory")
            return


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json(path: str | os.PathLike, payload: dict) -> Path:
    return write_atomic(path, json.dumps(payload, indent=2, sort_keys=False) + "\n")
