"""The benchmark scripts run end to end in their CI-sized form (speed is never asserted here)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(args, tmp_path):
    env = dict(os.environ, TRITON_INTERPRET=os.environ.get("TRITON_INTERPRET", "1"))
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, check=True, capture_output=True,
                          text=True, timeout=600).stdout


def test_cpu_engine_benchmark_small(tmp_path):
    out = tmp_path / "bench.json"
    printed = _run(["benchmarks/bench_cpu_engine.py", "--clients", "3", "--coords", "200000",
                    "--tensor-size", "30000", "--repeat", "1", "--json", str(out)], tmp_path)
    figures = json.loads(out.read_text())
    assert "engine_over_floor" in printed and "sampled_over_expected" in printed and figures["clients"] == 3
    assert figures["bytes"] == 3 * 200_000 * 4
    assert figures["engine_over_floor"] == figures["engine_s"] / figures["floor_s"]
    assert figures["sampled_over_expected"] == figures["sampled_s"] / figures["engine_s"]
    assert figures["speedup_over_naive_flat"] == figures["naive_flat_s"] / figures["engine_s"]
    # The memory probe really scored the files it wrote (a probe that failed silently would not).
    assert figures["checkpoint_clients_scored"] == 3
    # 3 clients + the task mask, each tensor padded to whole words: 6 x ceil(30,000 / 32) + 20,000 / 32
    assert figures["packed_bits_MiB"] == (3 + 1) * (6 * 938 + 625) * 4 / 2**20


def test_triton_benchmark_smoke(tmp_path):
    printed = _run(["benchmarks/bench_triton.py", "--smoke"], tmp_path)
    assert "ratio pack grouped / copy flat" in printed and "speed-up pack grouped + round_counts vs naive" in printed


def test_scaling_benchmark_smoke(tmp_path):
    figure = tmp_path / "scaling.png"
    printed = _run(["benchmarks/bench_scaling.py", "--smoke", "--figure", str(figure)], tmp_path)
    rows = {line.split("|")[1].strip() + " p=" + line.split("|")[2].strip() for line in printed.splitlines()
            if line.startswith("| ") and not line.startswith("| method")}
    expected = {f"{m} p={p}" for m in ("KFCA-QP", "KFCA-QP counts", "KFCA-D") for p in ("1", "2", "5", "all")}
    assert rows == expected | {"CA-QP p=all", "CA-D p=all"}
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_overhead_benchmark_small(tmp_path):
    printed = _run(["benchmarks/bench_overhead.py", "--calls", "2"], tmp_path)
    cases = re.findall(r"^(2 clients x 5,280 \(flat\)|tiny recipe: .*?)\s+(expected|sampled)\s+\d+us", printed, re.M)
    assert len(cases) == 4 and {c[1] for c in cases} == {"expected", "sampled"}


def test_robustness_benchmark_synthetic_part(tmp_path):
    printed = _run(["benchmarks/bench_robustness.py", "--seeds", "2", "--rounds", "0"], tmp_path)
    # no false positive; copies with 1%, 5%, 10%, 20% of signs flipped, the Gaussian-noise copies and the
    # colluding pair caught (in the full run the 20%-noise copy is caught in about half the rounds)
    assert "| 4 | 0/2 | 2/2 | 2/2 | 2/2 | 2/2 | 2/2 | 2/2 | 2/2 |" in printed
    assert "Honest rounds with any pair flagged: 0 of 12." in printed
