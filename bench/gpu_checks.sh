#!/usr/bin/env bash
# Every GPU check the issues owe, in as few device calls as possible (the machine starts bare):
#   build _C, `specdec-kernels selftest`, `pytest -m gpu`, compute-sanitizer memcheck over the CUDA kernels' GPU tests,
#   and the microbenchmarks. Results land in OUT (one folder; at most 8 files come back).
#
#   bash bench/gpu_checks.sh "$OUT"                        # every stage (more than one 10-minute call)
#   STAGES="test memcheck" bash bench/gpu_checks.sh "$OUT"  # a subset; stages run in this order:
#     selftest  specdec-kernels selftest, the shipped command: every op x GPU backend vs the torch reference at
#               small and production shapes, CUDA-graph replays, the engine vs greedy (selftest.txt with the
#               matrix and the progress, selftest.json rewritten after every op; SELFTEST_ARGS adds flags, e.g. --quick)
#     test      pytest -m gpu                                 (pytest_gpu.log)
#     memcheck  compute-sanitizer over tests/test_gpu_*.py    (memcheck.log)
#     verify    bench/bench_verify.py                         (verify.json/.md; BENCH_ARGS adds flags)
#     attn      bench/bench_tree_attention.py, the target slice B {8, 32} x P 4096 (ATTN_ARGS overrides)
#     kv        bench/bench_kv_compact.py                     (kv_compact.json/.md)
#     exit      bench/bench_early_exit_topk.py                (early_exit_topk.json/.md)
#     e2e       bench/e2e.py: TinyLlama-shaped aligned pair at 3 noise levels + the default pair, batch 1/4/16,
#               greedy + sampling, gamma 4 (e2e.json/.md, e2e_speedup.png, e2e_tokens.png, rewritten after
#               every pair so a cut-off run keeps what it measured; E2E_ARGS overrides)
#     demo      specdec-kernels demo on the embedded default models (demo.txt, demo.json)
#     ppd       bench/ppd_latency.py on the embedded default models (ppd_latency_cuda.json/.md)
# build.log, build_info.json and summary.txt are written every time.
set -uo pipefail
out=${1:?usage: bash bench/gpu_checks.sh OUTDIR}
stages=${STAGES:-selftest test memcheck verify attn kv exit e2e demo ppd}
mkdir -p "$out"
cd "$(dirname "$0")/.."
status=0
want() { [[ " $stages " == *" $1 "* ]]; }

echo "== build" | tee "$out/summary.txt"
if ! SPECDEC_REQUIRE_CUDA=1 pip install --no-build-isolation --no-deps -e . -q >"$out/build.log" 2>&1; then
  echo "build failed (see build.log)" | tee -a "$out/summary.txt"
  exit 1
fi
python -c "import json, specdec_kernels; print(json.dumps(specdec_kernels.build_info(), indent=1))" >"$out/build_info.json"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/summary.txt"

if want selftest; then
  echo "== specdec-kernels selftest" | tee -a "$out/summary.txt"
  # shellcheck disable=SC2086
  timeout "${SELFTEST_TIMEOUT:-540}" specdec-kernels selftest ${SELFTEST_ARGS:-} --json "$out/selftest.json" \
    >"$out/selftest.txt" 2>&1
  rc=$?
  grep -E "^selftest: " "$out/selftest.txt" | tail -n 1 | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || { echo "selftest exit $rc (1: a check failed, 124: timed out; see selftest.txt)" | tee -a "$out/summary.txt"; status=1; }
fi

if want test; then
  echo "== pytest -m gpu" | tee -a "$out/summary.txt"
  timeout "${PYTEST_TIMEOUT:-540}" python -m pytest -m gpu -q -p no:cacheprovider -rs >"$out/pytest_gpu.log" 2>&1
  rc=$?
  tail -n 3 "$out/pytest_gpu.log" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || status=1
fi

if want memcheck; then
  echo "== compute-sanitizer memcheck (CUDA kernel tests, caching allocator off)" | tee -a "$out/summary.txt"
  cuda_tests=$(ls tests/test_gpu_*.py | grep -v -e statistics -e hf_models)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${MEMCHECK_TIMEOUT:-480}" compute-sanitizer --tool memcheck \
    --error-exitcode 9 --target-processes all python -m pytest -q -x -p no:cacheprovider -m gpu \
    -k "${MEMCHECK_FILTER:-not graph and not 151936 and not 128256 and not long}" $cuda_tests >"$out/memcheck.log" 2>&1
  rc=$?
  grep -E "ERROR SUMMARY|passed|failed" "$out/memcheck.log" | tail -n 3 | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || status=1
fi

bench() {  # name, timeout, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name" | tee -a "$out/summary.txt"
  timeout "$limit" "$@" --out "$out" >/dev/null 2>>"$out/summary.txt" || { echo "$name failed" | tee -a "$out/summary.txt"; status=1; }
}
# shellcheck disable=SC2086
want verify && bench bench_verify "${BENCH_TIMEOUT:-540}" python bench/bench_verify.py ${BENCH_ARGS:-}
# shellcheck disable=SC2086
want attn && bench bench_tree_attention "${BENCH_TIMEOUT:-540}" python bench/bench_tree_attention.py \
  ${ATTN_ARGS:---batch 8 32 --prefix 4096}
want kv && bench bench_kv_compact "${BENCH_TIMEOUT:-300}" python bench/bench_kv_compact.py
want exit && bench bench_early_exit_topk "${BENCH_TIMEOUT:-300}" python bench/bench_early_exit_topk.py
# shellcheck disable=SC2086
want e2e && bench e2e "${BENCH_TIMEOUT:-560}" python bench/e2e.py \
  ${E2E_ARGS:---noise 0 0.1 0.5 --gammas 4 --max-new-tokens 96 --repeats 1 --method-timeout 120}
if want demo; then
  echo "== demo" | tee -a "$out/summary.txt"
  timeout "${BENCH_TIMEOUT:-300}" specdec-kernels demo --json "$out/demo.json" >"$out/demo.txt" 2>>"$out/summary.txt" \
    || { echo "demo failed" | tee -a "$out/summary.txt"; status=1; }
fi
want ppd && bench ppd_latency "${BENCH_TIMEOUT:-300}" python bench/ppd_latency.py --device cuda
echo "== exit $status" | tee -a "$out/summary.txt"
exit $status
