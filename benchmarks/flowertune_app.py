"""Flower's own FlowerTune app (``examples/flowertune-llm-general-nlp`` of a Flower checkout), run offline with KFCA.

    PYTHONPATH=$PWD APPVENV/bin/python benchmarks/flowertune_app.py --app FLOWER/examples/flowertune-llm-general-nlp \
        --own-replay-limit 0.02 --out /tmp/flowertune-rule3.json      # the old resubmission rule (rule 3)
    PYTHONPATH=$PWD APPVENV/bin/python benchmarks/flowertune_app.py --app ... --out /tmp/flowertune-default.json
    PYTHONPATH=$PWD .venv/bin/python benchmarks/flowertune_app.py --recount /tmp/flowertune-*.json   # one table

APPVENV: a Python with the app's own dependencies (its pyproject: trl 0.8.1, peft 0.6.2, transformers 4.53,
bitsandbytes, flwr-datasets, omegaconf; flwr 1.42 for KFCA) and kfca_llm's; its ``bin`` holds ``flwr`` and
``flower-superlink``. The project's benchmarks and tests never need the app.

Builds (``flowertune_assets.py``) a tiny Llama (``LlamaConfig``), a byte-level BPE tokenizer trained here and an
alpaca-style data set of 400 rows (columns instruction, input, output; generated from a word list), all local; copies
the app and changes only: the model and data set ids (pyproject), two run-config keys for KFCA,
``KFCAStrategy(strategy, ...)`` around the strategy the ServerApp builds (identity ``declared``), and in the ClientApp
the declared participant (``partition-<id>``) and partition 0 sending ``global - (trained - global)``. Then runs it
with Flower's simulation engine (``flwr run`` on a local SuperLink started here, HF_HUB_OFFLINE=1): 20 SuperNodes,
``strategy.fraction-train`` 0.1 (two per round), ``train.training-arguments.max-steps=2``, ``train.seq-length=64``,
``--rounds`` rounds; every
other setting is the app's (``train.dynamic-data-seed = false``, 4-bit quantization, its learning rates).

Prints the rounds and a table, and writes them as JSON (``--out``): honest participations, those KFCA took for
resubmissions of an earlier update of their own (its log lines), charged back, honest paid < 0, honest nodes
ending at exactly 0, every meeting of the flipper with an honest partner, each node's mean, and whether the
flipper's mean is below every honest node's, and honest updates whose packed signs are bit-identical to an
earlier one of the same node (the ledger's ``sign_sha256``). Rewards come from the ledger, resubmissions from the
ServerApp's log.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from kfca_llm.report import write_atomic

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from flower_few_peers import flip_meetings, paid_by_node, rounds_by_partition, summarise  # noqa: E402
from flowertune_assets import build_assets  # noqa: E402

FLIPPER = 0
"""The partition that flips its update."""
SERVER_WRAP = '''
    # KFCA: pay every reply (identities declared by the ClientApp); kfca.own-replay-limit < 0: the default; the
    # signs and value sketches kept, so that `kfca-llm verify` recomputes the run
    from kfca_llm.flower import KFCAStrategy

    limit = context.run_config["kfca.own-replay-limit"]
    strategy = KFCAStrategy(strategy, ledger=context.run_config["kfca.ledger"], identity="declared", keep_signs=True,
                            **({} if limit < 0 else {"own_replay_limit": limit}))

    # Start strategy, run FedAvg for `num_rounds`'''
CLIENT_FLIP = '''    state = get_peft_model_state_dict(model)
    if partition_id == %d:  # KFCA benchmark: this partition flips its update, global - (trained - global)
        sent = msg.content["arrays"].to_torch_state_dict()
        state = {k: 2 * sent[k] - v for k, v in state.items()}
    model_record = ArrayRecord(state)''' % FLIPPER
CLIENT_DECLARE = '''    content = RecordDict({"arrays": model_record, "metrics": metric_record})
    from kfca_llm.flower import declare_participant

    content = declare_participant(content, {"participant": f"partition-{partition_id}"})'''


def patches(model_dir: Path, data_dir: Path) -> list[tuple[str, str, str]]:
    """(file, text, replacement) for each change to the app; each text must occur exactly once."""
    return [("pyproject.toml", 'model.name = "mistralai/Mistral-7B-v0.3"', f'model.name = "{model_dir}"'),
            ("pyproject.toml", 'dataset.name = "flwrlabs/alpaca-gpt4"', f'dataset.name = "{data_dir}"'),
            ("pyproject.toml", "num-server-rounds = 200",
             'num-server-rounds = 200\nkfca.ledger = ""\nkfca.own-replay-limit = -1.0'),
            ("flowertune_generalnlp/server_app.py", "\n    # Start strategy, run FedAvg for `num_rounds`", SERVER_WRAP),
            ("flowertune_generalnlp/client_app.py", "    model_record = ArrayRecord(get_peft_model_state_dict(model))",
             CLIENT_FLIP),
            ("flowertune_generalnlp/client_app.py",
             '    content = RecordDict({"arrays": model_record, "metrics": metric_record})', CLIENT_DECLARE)]


def patch_app(app: Path, dest: Path, model_dir: Path, data_dir: Path) -> Path:
    """Copy the app to ``dest`` and apply ``patches`` (a ValueError naming the text where the app differs)."""
    shutil.copytree(app, dest, ignore=shutil.ignore_patterns("results", "__pycache__", "*.pyc"))
    for name, old, new in patches(model_dir, data_dir):
        path = dest / name
        text = path.read_text(encoding="utf-8")
        if text.count(old) != 1:
            raise ValueError(f"{name}: expected {old!r} once, found it {text.count(old)} times (another app version?)")
        path.write_text(text.replace(old, new), encoding="utf-8")
    return dest


RESUBMITTED = re.compile(r"KFCA: round (\d+): (\S+) resubmitted an earlier update of their own \((?:own resubmission|"
                         r"(.*?)\): a copy, .*?(?:charged back (\d+\.\d+)|nothing to charge back))")
"""KFCA's warnings (``kfca_llm.flower.round_scoring.score_round``) of an own resubmission."""
FORFEITED = re.compile(r"KFCA: round (\d+): (\S+)'s update turned against its own earlier ones")
"""And of a forfeit (pool rule 8): what earlier submissions were paid, charged back."""


def resubmissions(log: str) -> dict[int, dict[str, float | None]]:
    """Round -> participant -> what KFCA charged back for an earlier update of its own that it took this one for
    (0.0: nothing to charge back; None: an own resubmission scored without the pool, not taken for a copy)."""
    out: dict[int, dict[str, float | None]] = {}
    for m in RESUBMITTED.finditer(log):
        charged = None if m.group(3) is None else float(m.group(4) or 0.0)
        out.setdefault(int(m.group(1)), {})[m.group(2)] = charged
    return out


def forfeits(log: str) -> dict[int, set[str]]:
    """Round -> the participants whose update KFCA took for a turn, charged back what earlier ones were paid."""
    out: dict[int, set[str]] = {}
    for m in FORFEITED.finditer(log):
        out.setdefault(int(m.group(1)), set()).add(m.group(2))
    return out


def partition(participant: str) -> int:
    """The partition of a declared participant (``name:partition-3`` -> 3)."""
    return int(participant.rsplit("-", 1)[1])


def rounds_from_ledger(contents, log: str) -> list[dict]:
    """The run's rounds by partition (``flower_few_peers.rounds_by_partition``): rewards, settlements and
    undetermined rounds from the ledger's ``contents`` (``kfca_llm.flower.read_ledger``), resubmissions (taken for a
    copy of an own earlier update) and forfeits from the log."""
    rewards: dict[int, dict[str, float]] = {}
    for row in contents.rewards:
        rewards.setdefault(row.round, {})[row.participant] = row.reward
    undetermined = {r.round: tuple(r.undetermined or ()) for r in contents.rounds}
    taken = {t: {w for w, charged in who.items() if charged is not None} for t, who in resubmissions(log).items()}
    partition_of = {t: {w: partition(w) for w in paid} for t, paid in rewards.items()}
    return rounds_by_partition(rewards, contents.settlements, undetermined, taken, forfeits(log), partition_of)


def identical_signs(rows) -> list[tuple[int, list[int]]]:
    """(partition, rounds) for each participant that sent bit-identical packed signs in several rounds (the ledger's
    ``sign_sha256``; ``rows``: its reward rows): what the default own-replay rule (limit 0) takes for a replay."""
    seen: dict[tuple[str, str], list[int]] = {}
    for row in sorted(rows, key=lambda r: r.round):
        seen.setdefault((row.participant, row.sign_sha256), []).append(row.round)
    return sorted((partition(w), t) for (w, _), t in seen.items() if len(t) > 1)


def own_pairs(contents, read, flipper: int = FLIPPER) -> dict:
    """Every two participations of one honest node (``contents``: the ledger's, ``read(sha, size=)``: its kept files):
    how many repeat every sign (equal ``sign_sha256``), how many repeat every sampled value within the rounding slack
    (pool rule 11's replay, from the value sketches the ledger kept: None where it kept none, a run without
    ``keep_signs`` records their digests only), and the smallest share of sampled values apart beyond the slack."""
    from kfca_llm.fl.pool_values import share_apart
    from kfca_llm.flower.pool_replay import recorded_values

    rows: dict[int, list] = {}
    for row in contents.rewards:
        rows.setdefault(row.round, []).append(row)
    sketches = {}
    for round_row in filter(lambda r: r.signs_kept, contents.rounds):
        participants = [r.participant for r in rows.get(round_row.round, [])]
        sketches.update({(p, round_row.round): v for p, v in recorded_values(round_row, participants, read).items()})
    mine: dict[str, list] = {}
    for row in sorted(contents.rewards, key=lambda r: r.round):
        if partition(row.participant) != flipper:
            mine.setdefault(row.participant, []).append((row.sign_sha256, sketches.get((row.participant, row.round))))
    pairs = [(a, b) for history in mine.values() for k, b in enumerate(history) for a in history[:k]]
    apart = [share_apart(a[1], b[1]) for a, b in pairs if a[1] is not None and b[1] is not None]
    return {"honest_own_pairs": len(pairs), "honest_own_pairs_same_signs": sum(a[0] == b[0] for a, b in pairs),
            "honest_own_pairs_same_values": sum(v == 0 for v in apart) if apart else None,
            "honest_own_pairs_least_apart": min(apart) if apart else None}


def figures(rounds: list[dict], log: str, flipper: int = FLIPPER) -> dict:
    """The figures of a run (``rounds`` as ``rounds_from_ledger`` gives them, ``log`` the ServerApp's)."""
    honest = [(r["round"], int(p), v) for r in rounds for p, v in r["rewards"].items() if int(p) != flipper]
    charged = [(t, partition(w), c) for t, who in resubmissions(log).items() for w, c in who.items()
               if c is not None and partition(w) != flipper]
    paid = paid_by_node(rounds)
    means = {p: sum(v) / len(v) for p, v in sorted(paid.items())}
    meetings = [{"round": m.round, "partner": m.partner, "partner_paid": m.partner_paid, "flipper_paid": m.flipper_paid,
                 "right": m.right, "undetermined": m.undetermined} for m in flip_meetings(rounds, {flipper: "flip"})]
    honest_means = [m for p, m in means.items() if p != flipper]
    return {"honest_participations": len(honest),
            "honest_taken_for_own_resubmissions": len(charged),
            "honest_charged_back": sum(c > 0 for _, _, c in charged),
            "honest_charged_back_sum": sum(c for _, _, c in charged),
            "honest_forfeits": sum(p != flipper for r in rounds for p in r.get("forfeited", ())),
            "honest_paid_below_0": sum(v < 0 for *_, v in honest),
            "honest_nodes_at_0": sum(sum(paid[p]) == 0 for p in paid if p != flipper),
            "honest_nodes": len(honest_means),
            "flipper_meetings": meetings,
            "flipper_partners_right": sum(m["right"] for m in meetings),
            "flipper_below_every_honest": (flipper in means and bool(honest_means)
                                           and means[flipper] < min(honest_means)),
            "mean_reward": {str(p): m for p, m in means.items()},
            "participations": {str(p): len(v) for p, v in paid.items()}}


def table(runs: list[dict]) -> str:
    """The runs as the markdown table of benchmarks/ROBUSTNESS.md."""
    lines = ["| rule | run | honest participations | taken for own resubmissions | charged back | forfeits | "
             "honest signs identical to an own earlier update | honest own pairs repeating every sampled value (least "
             "share apart) | paid < 0 | at 0 | flipper's partners right | flipper below every honest node | wall | UTC | "
             "load (start -> end) |", "|---" * 15 + "|"]
    for run in runs:
        f = run["figures"]
        same = f.get("honest_own_pairs_same_values")  # None, or missing: no value sketches kept (before rule 11)
        values = "-" if same is None else (f"{same} of {f['honest_own_pairs']} "
                                           f"({f['honest_own_pairs_least_apart']:.2f})")
        lines.append(f"| {run['rule']} | {run['name']} | {f['honest_participations']} | "
                     f"{f['honest_taken_for_own_resubmissions']} | {f['honest_charged_back']} | "
                     f"{f.get('honest_forfeits', '-')} | "
                     f"{sum(len(t) - 1 for p, t in f['sign_identical'] if p != FLIPPER)} | {values} | "
                     f"{f['honest_paid_below_0']} | {f['honest_nodes_at_0']} of {f['honest_nodes']} | "
                     f"{f['flipper_partners_right']} of {len(f['flipper_meetings'])} | "
                     f"{'yes' if f['flipper_below_every_honest'] else 'no'} | {run['wall_s']:.0f} s | "
                     f"{run['utc']} | {run.get('load_before', '?')} -> {run['load']} |")
    return "\n".join(lines)


def run_app(app_dir: Path, work: Path, run_config: str, nodes: int, timeout: float) -> tuple[str, str]:
    """``flwr run app_dir`` on a local simulation SuperLink started here (stopped after); (the streamed log, the
    run's status from ``flwr ls``). Flower's tools are the ones beside this Python."""
    bin_dir = Path(sys.executable).parent
    home = work / "flwr-home"
    env = {**os.environ, "FLWR_HOME": str(home), "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1", "FLWR_DISABLE_UPDATE_CHECK": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    (home / "local-superlink").mkdir(parents=True, exist_ok=True)
    # As `flwr run` starts it (flwr/cli/local_superlink.py), but here, so that its process is ours to stop.
    superlink = subprocess.Popen(
        [str(bin_dir / "flower-superlink"), "--insecure", "--simulation", "--isolation", "subprocess",
         "--control-api-address", "127.0.0.1:39093", "--host", "127.0.0.1", "--port", "39091",
         "--database", str(home / "local-superlink" / "state.db")],
        cwd=work, env=env, stdout=open(work / "superlink.log", "w"), stderr=subprocess.STDOUT,
        start_new_session=True)
    try:
        time.sleep(5)
        if superlink.poll() is not None:
            raise RuntimeError(f"flower-superlink exited {superlink.returncode}: see {work / 'superlink.log'}")
        out = subprocess.run([str(bin_dir / "flwr"), "run", str(app_dir), "--stream", "--run-config", run_config,
                              "--federation-config", f"num-supernodes={nodes}"], cwd=work, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout).stdout
        status = subprocess.run([str(bin_dir / "flwr"), "ls", "--format", "json"], cwd=work, env=env, text=True,
                                capture_output=True, timeout=120).stdout
        return out, status
    finally:
        os.killpg(superlink.pid, signal.SIGTERM)  # the SuperLink and the simulation it started
        try:
            superlink.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(superlink.pid, signal.SIGKILL)


def count(work: Path) -> tuple[list[dict], dict]:
    """The rounds and the figures of a finished run in ``work`` (its ledger and its ServerApp's log)."""
    from kfca_llm.flower import read_ledger

    from kfca_llm.flower.ledger import signs_path

    contents, log = read_ledger(work / "rewards.sqlite"), (work / "run.log").read_text(encoding="utf-8")
    rounds = rounds_from_ledger(contents, log)

    def read(sha: str, rows: int = 1, size: int | None = None) -> np.ndarray:  # the run's own kept files
        return np.frombuffer(signs_path(work / "rewards.sqlite", sha).read_bytes(), dtype="<i4")

    return rounds, {**figures(rounds, log), "sign_identical": identical_signs(contents.rewards),
                    **own_pairs(contents, read)}


def recount(paths: list[Path]) -> int:
    """Count the figures of finished runs again (their ``--out`` files name their work folders), rewrite the files
    and print their table."""
    runs = []
    for path in paths:
        run = json.loads(path.read_text())
        run["rounds"], run["figures"] = count(Path(run["work"]))
        write_atomic(path, json.dumps(run, indent=1))
        runs.append(run)
    print(table(runs))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--app", type=Path, help="examples/flowertune-llm-general-nlp of a Flower checkout")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--own-replay-limit", type=float, default=None,
                        help="KFCAStrategy's own_replay_limit (rule 3: 0.02; default: the strategy's default)")
    parser.add_argument("--work", type=Path, default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--timeout", type=float, default=3 * 3600, help="seconds the run may take")
    parser.add_argument("--out", type=Path, default=None, help="write the rounds and figures as JSON here")
    parser.add_argument("--recount", type=Path, nargs="+", metavar="JSON",
                        help="instead of a run: count finished runs (their --out files) again and print their table")
    args = parser.parse_args(argv)
    if args.recount:
        return recount(args.recount)
    if args.app is None:
        parser.error("--app is required (or --recount)")
    work = Path(tempfile.mkdtemp(prefix="flowertune-", dir=args.work)).resolve()
    model_dir, data_dir = build_assets(work / "assets")
    app_dir = patch_app(args.app.resolve(), work / "app", model_dir, data_dir)
    ledger = work / "rewards.sqlite"
    limit = -1.0 if args.own_replay_limit is None else args.own_replay_limit
    run_config = (f"num-server-rounds={args.rounds} train.training-arguments.max-steps=2 train.seq-length=64 "
                  f"strategy.fraction-train=0.1 kfca.ledger='{ledger}' kfca.own-replay-limit={limit}")
    load_before, started, utc = Path("/proc/loadavg").read_text().split()[:3], time.time(), time.strftime(
        "%Y-%m-%d %H:%M", time.gmtime())
    log, status = run_app(app_dir, work, run_config, args.nodes, args.timeout)
    wall = time.time() - started
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    (work / "run.log").write_text(log, encoding="utf-8")
    if not ledger.is_file():
        print(log[-4000:], status, sep="\n")
        raise SystemExit(f"no ledger written: the run failed (log: {work / 'run.log'})")
    rounds, found = count(work)
    rule = "3 (0.02)" if args.own_replay_limit == 0.02 else (
        "default" if args.own_replay_limit is None else f"limit {args.own_replay_limit}")
    print(summarise(rounds, {FLIPPER: "flip"}, SimpleNamespace(nodes=args.nodes, fraction=0.1, data_order="static",
                                                                min_peers=None), wall))
    run = {"rule": rule, "name": work.name, "figures": found, "wall_s": wall, "utc": utc, "load": load,
           "load_before": " ".join(load_before)}
    print(table([run]))
    if args.out is not None:
        write_atomic(args.out, json.dumps({**run, "args": {k: str(v) for k, v in vars(args).items()},
                                           "status": status, "run_config": run_config, "work": str(work),
                                           "rounds": rounds}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
