"""The runs ``kfca-llm check`` reads: the part of each ``report.json`` a check needs, validated (report files are
user input). ``load_runs`` takes report files, run folders, or the folder of a multi-seed run with its
``summary.json``; every error is one ``InputError`` naming the file and what is wrong.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from .errors import InputError

Number = StrictFloat | StrictInt


class _Strategy(BaseModel):
    model_config = ConfigDict(extra="ignore")
    per_round: list[Number]
    copy_rounds: list[StrictInt] = []
    own_resubmission_rounds: list[StrictInt] = []


class _Pair(BaseModel):
    model_config = ConfigDict(extra="ignore")
    client: StrictStr
    peer: StrictStr
    honest_pair: StrictBool
    delta: list[list[Number]]


class _Round(BaseModel):
    model_config = ConfigDict(extra="ignore")
    pairs: list[_Pair]


class _Report(BaseModel):
    model_config = ConfigDict(extra="ignore")
    seed: StrictInt
    rounds: StrictInt
    strategies: dict[str, _Strategy]
    round_records: list[_Round] | None = None
    recipe: StrictStr | None = None


@dataclass(frozen=True)
class HonestPair:
    client: str
    peer: str
    delta: np.ndarray


@dataclass(frozen=True)
class Run:
    """One federation's report: rewards per strategy per round, and the honest pairs' delta matrices."""

    path: Path
    seed: int
    rewards: dict[str, np.ndarray]
    honest_pairs: list[list[HonestPair]] | None
    """Per round (None when the report has no ``round_records``)."""
    copies: dict[str, frozenset[int]] = field(default_factory=dict)
    """Strategy -> the rounds its submission was paid as a copy of an earlier round's under the run's duplicate
    policy (report.json's ``copy_rounds`` less its ``own_resubmission_rounds``: a replay of the analysis client's
    own earlier update is scored without the pool, on the round's peers, and keeps its order; reports written
    before own resubmissions were told apart list them as paid copies, which they then were)."""

    @property
    def rounds(self) -> int:
        return len(next(iter(self.rewards.values())))

    @property
    def figure(self) -> Path:
        return self.path.parent / "rewards.png"


MAX_REPORT_BYTES = 1 << 30


def _report_text(path: Path) -> str:
    """A report file's text: a regular file (a FIFO is refused without waiting for a writer), at most 1 GiB."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise InputError(f"report {path}: cannot be opened: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise InputError(f"report {path} is not a regular file; not read")
        if info.st_size > MAX_REPORT_BYTES:
            raise InputError(f"report {path}: {info.st_size} bytes, more than any report ({MAX_REPORT_BYTES})")
        data = handle.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"report {path}: not UTF-8 text ({exc})") from None


def _finite(values, what: str) -> np.ndarray:
    """``values`` as a float array: refused when a value overflows a float or is infinite (NaN stays: it never
    holds an expectation)."""
    try:
        array = np.asarray(values, dtype=float)
    except OverflowError:
        raise InputError(f"{what}: a number too large for a float") from None
    if np.isinf(array).any():
        raise InputError(f"{what}: an infinite value")
    return array


def load_report(path: Path) -> Run:
    """A run from one ``report.json``; InputError names the file and what is wrong."""
    text = _report_text(path)
    try:
        raw = json.loads(text)
    except RecursionError:
        raise InputError(f"report {path}: cannot be read as JSON: nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and integers past Python's digit limit
        raise InputError(f"report {path}: cannot be read as JSON: {str(exc)[:200]}") from None
    try:
        report = _Report.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        key = ".".join(str(part) for part in err["loc"])
        raise InputError(f"report {path}: key {key[:200]!r}: {err['msg']}") from None
    if abs(report.seed) >= 1 << 64:
        raise InputError(f"report {path}: the seed is not a 64-bit integer")
    if not report.strategies:
        raise InputError(f"report {path} has no strategies (the recipe's kfca.attacks is empty)")
    for spec, entry in report.strategies.items():
        if len(entry.per_round) != report.rounds or report.rounds < 1:
            raise InputError(f"report {path}: strategy {spec!r} has {len(entry.per_round)} per-round rewards "
                             f"for {report.rounds} rounds")
    pairs = None
    if report.round_records is not None:
        if len(report.round_records) != report.rounds:
            raise InputError(f"report {path}: {len(report.round_records)} round records for {report.rounds} rounds")
        pairs = []
        for t, record in enumerate(report.round_records, start=1):
            honest = []
            for p in record.pairs:
                where = f"report {path}: round {t}: the delta of {p.client!r} ~ {p.peer!r}"
                try:
                    delta = _finite(p.delta, where)
                except InputError:
                    raise
                except ValueError:  # rows of different lengths: not a matrix
                    delta = np.zeros(0)
                if delta.ndim != 2 or delta.shape[0] != delta.shape[1] or delta.shape[0] < 2:
                    raise InputError(f"report {path}: round {t}: the delta of {p.client!r} ~ {p.peer!r} "
                                     "is not a square matrix")
                if p.honest_pair:
                    honest.append(HonestPair(p.client, p.peer, delta))
            pairs.append(honest)
    rewards = {spec: _finite(entry.per_round, f"report {path}: strategy {spec!r}")
               for spec, entry in report.strategies.items()}
    copies = {spec: frozenset(entry.copy_rounds) - frozenset(entry.own_resubmission_rounds)
              for spec, entry in report.strategies.items()}
    copies = {spec: rounds for spec, rounds in copies.items() if rounds}
    return Run(path=path, seed=report.seed, rewards=rewards, honest_pairs=pairs, copies=copies)


def _summary_reports(folder: Path) -> list[Path]:
    """The report files a multi-seed run's ``summary.json`` lists (paths inside ``folder`` only)."""
    summary = folder / "summary.json"
    try:
        runs = json.loads(_report_text(summary))["runs"]
        paths = [Path(p) for p in runs.values()]
    except RecursionError:
        raise InputError(f"{summary}: not a multi-seed summary (JSON nested too deeply)") from None
    except InputError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{summary}: not a multi-seed summary ({str(exc)[:200]})") from None
    inside = folder.resolve()
    if not paths or any(p.is_absolute() or ".." in p.parts or not (folder / p).resolve().is_relative_to(inside)
                        for p in paths):
        raise InputError(f"{summary}: 'runs' must list report paths inside {folder}")
    return [folder / p for p in paths]


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Runs from ``report.json`` files, run folders (holding one), or multi-seed folders (``summary.json``)."""
    files: list[Path] = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            if (path / "report.json").is_file():
                files.append(path / "report.json")
            elif (path / "summary.json").is_file():
                files.extend(_summary_reports(path))
            else:
                raise InputError(f"{path} holds no report.json nor summary.json")
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"no report {path}")
    return [load_report(f) for f in files]
