#!/usr/bin/env bash
# One call on a lent GPU machine (the workplace's device tool): the test suite with CUDA present, the finance
# recipe at its real dimensions, and bench_triton.py, with every log under $OUT. The machine's image has
# torch, triton, numba, transformers, peft and pytest; what it lacks (Flower and its dependencies,
# bitsandbytes, datasets, pydantic, cryptography) travels as wheels in .whl/ (not tracked). Ray does not
# (its wheel is larger than a call may carry), so the two Ray simulation modules are left out. .whl/ held, for
# Python 3.12 (pip download --no-deps --only-binary=:all: --python-version 3.12 ...): flwr 1.42.0, tomli, tomli_w,
# cryptography, cffi, pycparser, pycryptodome, grpcio, grpcio-health-checking, protobuf, pydantic, pydantic_core,
# annotated-types, typing-inspection, datasets, dill, multiprocess, SQLAlchemy, greenlet, alembic, Mako, fastapi,
# starlette, uvicorn, httptools, watchfiles, websockets, python-dotenv, jsonschema (+ specifications, referencing,
# rpds-py), iterators, prompt_toolkit, wcwidth, truststore, tzdata, httpx2, httpcore2 (the versions of the suite's
# venv), and bitsandbytes 0.50.2 with its CUDA 13.0 and CPU libraries only (43 MB -> 3.6 MB).
#
#   bash benchmarks/gpu_session.sh [SECONDS]                # SECONDS: the call's budget (default 560)
#   bash benchmarks/gpu_session.sh SECONDS TEST [TEST ...]  # those tests again, and inspect_kernels.py's JSON
set -u
budget=${1:-560}
start=$(date +%s)
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
left() { echo $((budget - ($(date +%s) - start))); }

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
{
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
} > "$OUT/setup.log" 2>&1
tail -n 9 "$OUT/setup.log"
echo "setup done, $(left) s left"

if [ "$#" -gt 1 ]; then  # a rerun of named tests (after fixing what the full call found) and the compiled kernels
  shift
  timeout $(( $(left) - 40 )) python3 -m pytest -q -n 6 --timeout 240 -p no:cacheprovider "$@" > "$OUT/tests.log" 2>&1
  echo "tests exit $?, $(left) s left"
  python3 benchmarks/inspect_kernels.py --json > "$OUT/inspect.json" 2> "$OUT/inspect.log"
  python3 -c "import json,sys; [print(r) for r in json.load(open(sys.argv[1])) if r['spills'] or r['vector_loads'] == 0]" "$OUT/inspect.json"
  grep -E "^(FAILED|ERROR|E  )" "$OUT/tests.log" | cut -c1-300 | head -40; tail -n 3 "$OUT/tests.log"
  exit 0
fi

# The suite (CUDA tensors and compiled kernels through the device fixture) beside the recipe run: the suite
# keeps the CPU cores busy, the recipe the GPU; the recipe's phases are timed with the suite running beside it.
timeout $(( $(left) - 200 )) python3 -m pytest -q -n 12 --timeout 240 -p no:cacheprovider \
  --ignore tests/flower/test_simulation.py --ignore tests/flower/test_wrapped_simulation.py \
  --junitxml "$OUT/tests.xml" > "$OUT/tests.log" 2>&1 &
suite=$!
timeout $(( $(left) - 200 )) python3 benchmarks/bench_recipe.py --recipe finance --rounds 1 > "$OUT/recipe.log" 2>&1
echo "recipe exit $?, $(left) s left"
wait $suite
echo "suite exit $?, $(left) s left"

timeout $(( $(left) - 10 )) python3 benchmarks/bench_triton.py --repeats 3 --naive-max-clients 20 > "$OUT/triton.log" 2>&1
echo "bench_triton exit $?, $(left) s left"
if [ "$(left)" -gt 200 ]; then  # a second run on the same warm machine: the spread between runs
  timeout $(( $(left) - 10 )) python3 benchmarks/bench_triton.py --repeats 3 --naive-max-clients 20 > "$OUT/triton2.log" 2>&1
  echo "bench_triton (second run) exit $?, $(left) s left"
fi

echo "== suite"; grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | cut -c1-160 | head -40; tail -n 3 "$OUT/tests.log"
echo "== recipe"; grep -E "^(finance|command|\||mean)|Error|error" "$OUT/recipe.log" | cut -c1-400 | tail -n 12
echo "== bench_triton"; grep -vE "^\s*$" "$OUT/triton.log" | tail -n 20
[ -f "$OUT/triton2.log" ] && { echo "== bench_triton (second run)"; grep -vE "^\s*$" "$OUT/triton2.log" | tail -n 20; }
