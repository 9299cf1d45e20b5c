"""``benchmarks/flower_capture.py``: a Flower run's scored rounds, captured and paid again, give what the run paid.
Driven here through the strategy's own ``score_round`` (no Flower run: the capture wraps that function only), a
flipper among honest clients at two a round, within public strata, with a settlement, and a client that sends its
first update again with every value scaled (every sign repeated: a fresh submission by its value sketch, pool rule
11), its last round closing the run (pool rule 17); then paid again under another pool weight, which must change what
the rounds pay."""

import json
import sys
from pathlib import Path

import numpy as np

from kfca_llm.api import pack_updates
from kfca_llm.engine.duplicates import DuplicateRule
from kfca_llm.engine.public import PublicConditioning
from kfca_llm.fl.peer_pool import PeerPool, PoolSettings
from kfca_llm.fl.pool_values import value_sketch
from kfca_llm.flower.round_scoring import score_round

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from flower_capture import Capture, replay  # noqa: E402


def captured_run(tmp_path: Path) -> tuple[Path, dict[int, dict[str, float]]]:
    """(the capture of the run the module docstring describes, what the run paid: round -> node -> reward, its
    settlements included)."""
    rng = np.random.default_rng(5)
    persistent = rng.standard_normal(600)
    capture, pool, steps, live, first = Capture(score_round), PeerPool(PoolSettings()), [], {}, {}
    for t in range(1, 15):
        pair = sorted(rng.choice(6, size=2, replace=False).tolist())
        updates = {f"n{c}": {"w": ((-1 if c == 0 else 1) * (persistent + rng.standard_normal(600))).astype(np.float32)}
                   for c in pair}
        if "n5" in updates:  # the retrainer: its first update, every value scaled
            updates["n5"] = {"w": first.setdefault("n5", updates["n5"]["w"]) * np.float32(1 + 0.1 * t)}
        packer = pack_updates(updates)
        values = {c: value_sketch(u, packer.layout) for c, u in updates.items()}
        scored = capture(packer, pool, t, peers=None, seed=t, penalty="expected", bonus_fraction=0.5,
                         duplicates="zero", duplicate_rule=DuplicateRule(), reference=None, reference_weight=1.0,
                         keep_signs=False, public=steps[-16:], conditioning=PublicConditioning(), values=values,
                         closes_run=t == 14)
        assert "n5" not in scored.pooled.own_resubmissions
        live[t] = dict(scored.report.rewards)
        for settled in scored.settlements:
            live[settled.round][settled.participant] = settled.reward
        steps.append({"w": sum(u["w"] for u in updates.values()) / 2})
    path = tmp_path / "run.npz"
    capture.save(path, {t: {w: int(w[1:]) for w in paid} for t, paid in live.items()}, {"0": "flip"})
    return path, live


def test_a_captured_run_paid_again_is_what_it_paid_and_another_ranking_changes_it(tmp_path):
    path, live = captured_run(tmp_path)
    again = replay(path, {})
    assert {r["round"]: r["rewards"] for r in again["rounds"]} == {
        t: {str(int(w[1:])): v for w, v in sorted(paid.items(), key=lambda kv: int(kv[0][1:]))}
        for t, paid in live.items()}
    assert any(r["settled"] for r in again["rounds"])  # a settlement is replayed too
    # The live run's last round closed it (pool rule 17), settling round 10's pair; so does the replay. A capture of a
    # version before the rule (no closes_run recorded) closes at its last round only with close_last (--close-last).
    assert 14 in {at for r in again["rounds"] for at in r["settled"].values()}
    data = dict(np.load(path))
    meta = json.loads(bytes(data["__meta__"]).decode())
    for r in meta["rounds"]:
        del r["closes_run"]
    np.savez(tmp_path / "old.npz", **{**data, "__meta__": np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)})
    assert replay(tmp_path / "old.npz", {})["rounds"] != again["rounds"]
    assert replay(tmp_path / "old.npz", {}, close_last=True)["rounds"] == again["rounds"]
    assert sum(len(r["rewards"]) for r in again["rounds"]) == 28
    assert sum("5" in r["rewards"] for r in again["rounds"]) >= 2
    weighed_otherwise = replay(path, {"weight": 2.0})  # the pool's verdict against an in-round peer's 1
    assert weighed_otherwise["rounds"] != again["rounds"] and weighed_otherwise["args"]["weight"] == "2.0"
