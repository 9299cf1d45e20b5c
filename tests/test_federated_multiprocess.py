"""One process and two processes (accelerate launch --cpu, gloo) give the same rewards and adapters, with
LoRA dropout on and gradient accumulation (each client's dropout and data order are seeded per client).

The one-process run is this worker's (``main``, one torch thread as each launched process has): the two
launched processes are the real-process proof, a third interpreter would only import torch and peft again."""

import json
import os
import socket
import subprocess
import sys


ARGS = ["simulate", "--rounds", "2", "--attacks", "honest,flip,lagged:1,random,sparse:0.5", "--seed", "5",
        "--no-progress", "--set", "train.training-arguments.max-steps=2", "--set", "num-clients=8",
        "--set", "strategy.fraction-train=0.5", "--set", "train.save-every-round=1",
        "--set", "model.lora.peft-lora-dropout=0.2", "--set", "train.training-arguments.gradient-accumulation-steps=2",
        "--set", "train.training-arguments.per-device-train-batch-size=2", "--set", "train.save-client-updates=false"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(command, cwd):
    # Run outside the repository root so that only the installed package is on sys.path.
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def test_two_processes_match_one_process(tmp_path, monkeypatch):
    from kfca_llm.cli import main
    from kfca_llm.fl.rounds import torch_threads

    one, two = tmp_path / "one", tmp_path / "two"
    monkeypatch.chdir(tmp_path)
    with torch_threads(1):
        assert main([*ARGS, "--out", str(one)]) == 0
    _run([sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "2", "--num_machines", "1",
          "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
          "-m", "kfca_llm.cli", *ARGS, "--out", str(two)], tmp_path)
    a = json.loads((one / "report.json").read_text())
    b = json.loads((two / "report.json").read_text())
    # 4 clients per round (attacker + 3), dealt to 2 processes: every reward must be bit-identical.
    assert all(len(r["clients"]) == 4 for r in a["round_records"])
    assert a["strategies"] == b["strategies"]
    assert a["honest_clients"] == b["honest_clients"]
    assert a["round_records"] == b["round_records"]
    for t in ("001", "002"):
        name = f"adapters/round-{t}/adapter_model.safetensors"
        assert (one / name).read_bytes() == (two / name).read_bytes()
