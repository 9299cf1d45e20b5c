"""Crash trials of the reward ledger: a Flower server (KFCAStrategy) killed at a random time of its run.

Each trial starts the ledger test server (``tests/flower/flower_ledger_server.py``: KFCAStrategy over
five in-process numpy nodes, 6 rounds, ``keep_signs=True``, each ledger row written after a short delay
so that about half of the run is spent inside round transactions), SIGKILLs it after a random delay, then
checks what remains:

* every round in the ledger is complete (its status row, one reward row per valid reply, each sign file
  it names present) and no row belongs to a round the ledger does not list;
* ``kfca_llm.flower.verify_ledger`` passes (chain intact, every kept round recomputed and matching);
* the server restarted with ``resume=True`` (in this process) completes the run, and the ledger verifies again.

    python benchmarks/bench_ledger_crash.py                 # 30 trials
    python benchmarks/bench_ledger_crash.py --trials 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "tests" / "flower" / "flower_ledger_server.py"  # the crash tests' server, shared
ROUNDS = 6


def complete_rounds_only(ledger: Path) -> list[str]:
    """Problems of a ledger left by a crash (empty: only complete rounds)."""
    from kfca_llm.flower import read_ledger
    from kfca_llm.flower.ledger import signs_path
    from kfca_llm.flower.ledger_rows import SCORED

    contents = read_ledger(ledger)
    problems = []
    listed = {(r.run_id, r.round) for r in contents.rounds}
    for r in contents.rounds:
        rows = [w for w in contents.rewards if (w.run_id, w.round) == (r.run_id, r.round)]
        if r.status == SCORED and len(rows) != r.valid_replies:
            problems.append(f"round {r.round}: {len(rows)} reward rows for {r.valid_replies} valid replies")
        missing = [w.sign_sha256 for w in rows if r.signs_kept and not signs_path(ledger, w.sign_sha256).is_file()]
        if missing:
            problems.append(f"round {r.round}: {len(missing)} sign files missing")
    problems += [f"round {t}: rows without a round" for run, t in {(w.run_id, w.round) for w in contents.rewards}
                 if (run, t) not in listed]
    return problems


def trial(folder: Path, rng: random.Random, run_seconds: float) -> dict:
    from kfca_llm.flower import read_ledger, verify_ledger

    if str(SERVER.parent) not in sys.path:
        sys.path.insert(0, str(SERVER.parent))
    from flower_ledger_server import serve

    ledger = folder / "rewards.sqlite"
    proc = subprocess.Popen([sys.executable, str(SERVER), str(ledger), "--rounds", str(ROUNDS), "--keep-signs",
                             "--row-delay", "0.03"], cwd=SERVER.parent, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    delay = rng.uniform(0.0, run_seconds)
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    committed = len(read_ledger(ledger).rounds) if ledger.exists() else 0
    problems = complete_rounds_only(ledger) if ledger.exists() else []
    after_kill = verify_ledger(ledger) if ledger.exists() else None
    verified = after_kill is None or after_kill.ok
    if not verified:
        problems += after_kill.chain_errors + [f"round {r.round}: {r.status} {r.detail} {r.rows}"
                                               for r in after_kill.rounds if r.status == "mismatch"]
    # Restart and finish the run: the server's own code, in this process (what is checked is the ledger the kill
    # left; a fresh interpreter per trial would only import flwr and torch again).
    serve(ledger, rounds=ROUNDS, keep_signs=True, resume=True, report=lambda line: None)
    final = read_ledger(ledger)
    check = verify_ledger(ledger)
    return {"killed_after_s": round(delay, 3), "rounds_committed": committed, "problems": problems,
            "verified": verified, "resumed_rounds": [r.round for r in final.rounds],
            "resumed_verified": check.ok and all(r.status == "match" for r in check.rounds)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON summary line last")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        subprocess.run([sys.executable, str(SERVER), str(Path(tmp) / "timing.sqlite"), "--rounds", str(ROUNDS),
                        "--keep-signs", "--row-delay", "0.03"], cwd=SERVER.parent, check=True,
                       stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=600)
        run_seconds = time.perf_counter() - start  # kill times are drawn over a whole run, start-up included
        results = []
        for k in range(args.trials):
            folder = Path(tmp) / f"trial-{k}"
            folder.mkdir()
            results.append(trial(folder, rng, run_seconds))
            r = results[-1]
            if not args.json:
                print(f"trial {k:2d}: killed after {r['killed_after_s']:5.2f} s, {r['rounds_committed']} round(s) "
                      f"committed, {'complete' if not r['problems'] else r['problems']}, verify "
                      f"{'ok' if r['verified'] else 'FAILED'}; resumed to rounds {r['resumed_rounds']}, verify "
                      f"{'ok' if r['resumed_verified'] else 'FAILED'}")
    failed = [k for k, r in enumerate(results) if r["problems"] or not r["verified"] or not r["resumed_verified"]
              or r["resumed_rounds"] != list(range(1, ROUNDS + 1))]
    committed = [r["rounds_committed"] for r in results]
    summary = {"trials": len(results), "failed": failed, "verified": sum(r["verified"] for r in results),
               "resumed_complete": sum(r["resumed_rounds"] == list(range(1, ROUNDS + 1)) and r["resumed_verified"]
                                       for r in results),
               "rounds_committed_at_kill": {str(n): committed.count(n) for n in sorted(set(committed))},
               "uninterrupted_run_s": round(run_seconds, 2)}
    print(json.dumps(summary) if args.json else f"\n{summary}")


if __name__ == "__main__":
    main()
