#!/usr/bin/env bash
# One call on a lent GPU machine (the workplace's device tool), in the order that matters if time runs out: the pair
# counts against their popcount floor (bench_pair_counts.py), the GPU table with its spread (bench_triton.py --runs
# 3; 500 clients streamed in bf16 apart), then the suite with CUDA present (its kernel tests run on the GPU). Eight
# files come back under $OUT (the tool returns at most eight).
#
# The machine's image has torch, triton, numba, transformers, peft and pytest; what it lacks travels as wheels in
# .whl/ (not tracked; Python 3.12, `pip download --no-deps --only-binary=:all: --python-version 3.12 ...` at the
# versions of the suite's venv): flwr 1.42.0, tomli, tomli_w, cryptography, cffi, pycparser, pycryptodome, grpcio,
# grpcio-health-checking, protobuf, pydantic, pydantic_core, annotated-types, typing-inspection, datasets, dill,
# multiprocess, SQLAlchemy, greenlet, alembic, Mako, fastapi, starlette, uvicorn, httptools, watchfiles, websockets,
# python-dotenv, jsonschema (+ specifications, referencing, rpds-py), iterators, prompt_toolkit, wcwidth, truststore,
# tzdata, httpx2, httpcore2 and bitsandbytes 0.50.2. Ray does not travel (its wheel is larger than a call may
# carry), so the two Ray simulation modules are left out; nor do the suite's pinned torch 2.13 and Triton 3.9 (their
# CUDA wheels are larger than the 64 MiB a call carries): the image's versions run.
#
#   bash benchmarks/gpu_session.sh [SECONDS]          # SECONDS: the call's budget (default 540)
#   bash benchmarks/gpu_session.sh SECONDS rerun      # after a change to the counting: its tests and benchmark, the
#                                                     # 20-client rows of the GPU table, the finance recipe alone
set -u
budget=${1:-540}
start=$(date +%s)
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
left() { echo $((budget - ($(date +%s) - start))); }
log="$OUT/session.log"

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir .whl/*.whl &&
  python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . ||
  { echo "editable install failed: kfca_llm.kernels by a link"; ln -sfn ../kernels kfca_llm/kernels;
    echo "$PWD" > "$(python3 -c 'import site; print(site.getsitepackages()[0])')/kfca-llm-source.pth"; }
  python3 - <<'EOF'
import importlib
for name in ("torch", "triton", "numba", "transformers", "peft", "bitsandbytes", "flwr", "kfca_llm"):
    module = importlib.import_module(name)
    print(name, getattr(module, "__version__", "?"))
EOF
} > "$log" 2>&1
cat "$log"
echo "setup done, $(left) s left"

if [ "${2:-}" = rerun ]; then
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_pair_counts.py > "$OUT/kernels.log" 2>&1
  echo "kernel tests exit $?, $(left) s left"
  timeout 60 python3 benchmarks/bench_pair_counts.py --json "$OUT/pair_counts.json" > "$OUT/pair_counts.log" 2>&1
  echo "bench_pair_counts exit $?, $(left) s left"
  timeout 45 python3 benchmarks/bench_triton.py --runs 3 --repeats 1 --clients 20 --naive-max-clients 20 \
    --sampled-max-clients 0 --json "$OUT/triton.json" > "$OUT/triton.log" 2>&1
  echo "bench_triton exit $?, $(left) s left"
  timeout $(( $(left) - 5 )) python3 benchmarks/bench_recipe.py --recipe finance --rounds 1 > "$OUT/recipe.log" 2>&1
  echo "recipe exit $?, $(left) s left"
  tail -n 2 "$OUT/kernels.log"; grep -vE "^\s*$|Warning|warn" "$OUT/pair_counts.log" | tail -n 24
  grep -vE "^\s*$|Warning|warn" "$OUT/triton.log" | tail -n 5
  grep -E "^(finance|command|\||mean)|Error|error" "$OUT/recipe.log" | cut -c1-300 | tail -n 10
  exit 0
fi

timeout 130 python3 benchmarks/bench_pair_counts.py --json "$OUT/pair_counts.json" > "$OUT/pair_counts.log" 2>&1
echo "bench_pair_counts exit $?, $(left) s left"

timeout 150 python3 benchmarks/bench_triton.py --runs 3 --repeats 1 --clients 2,8,20,64,100 --naive-max-clients 20 \
  --sampled-max-clients 0 --json "$OUT/triton.json" > "$OUT/triton.log" 2>&1
echo "bench_triton exit $?, $(left) s left"
timeout 90 python3 benchmarks/bench_triton.py --runs 3 --repeats 1 --clients 500 --dtypes bf16 \
  --sampled-max-clients 0 --json "$OUT/triton500.json" > "$OUT/triton500.log" 2>&1
echo "bench_triton 500 exit $?, $(left) s left"

# The suite last, with the GPU present (the kernels' tests run on CUDA); the Ray modules stay out (see above).
timeout $(( $(left) - 10 )) python3 -m pytest -q -n 14 --timeout 240 -p no:cacheprovider \
  --ignore tests/flower/test_simulation.py --ignore tests/flower/test_wrapped_simulation.py > "$OUT/tests.log" 2>&1
echo "suite exit $?, $(left) s left"

echo "== pair counts"; grep -vE "^\s*$|Warning|warn" "$OUT/pair_counts.log" | tail -n 30
echo "== bench_triton"; grep -vE "^\s*$|Warning|warn" "$OUT/triton.log" | tail -n 16
grep -vE "^\s*$|Warning|warn" "$OUT/triton500.log" | tail -n 4
echo "== suite"; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | cut -c1-200 | head -30; tail -n 2 "$OUT/tests.log"
