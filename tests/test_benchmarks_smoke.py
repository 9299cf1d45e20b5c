"""The benchmark scripts run end to end in their CI-sized form (speed is never asserted here)."""

from __future__ import annotations

import json
import os
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
    assert "engine_over_floor" in printed and figures["clients"] == 3
    assert figures["engine_s"] > 0 and figures["floor_s"] > 0 and figures["naive_s"] > 0
    # 3 clients x 200,000 coordinates: one sign bit each, plus the shared task mask (padded to 32-bit words)
    assert 4 * 200_000 / 8 / 2**20 <= figures["packed_bits_MiB"] < 1.01 * 4 * 200_000 / 8 / 2**20


def test_triton_benchmark_smoke(tmp_path):
    printed = _run(["benchmarks/bench_triton.py", "--smoke"], tmp_path)
    assert "ratio pack grouped / copy flat" in printed and "speed-up pack grouped + round_counts vs naive" in printed
