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
#     test      pytest -m gpu, xdist workers when installed     (pytest_gpu.log, pytest_gpu.xml; TEST_ALONGSIDE=1 runs it
#               in the background beside the selftest; the quick tier unless PYTEST_ARGS="--gpu-tier full")
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
# DEADLINE_S=N shortens every stage's timeout so that none runs past N seconds from the start.
# build.log, build_info.json and summary.txt are written every time. The build is in place (bench/build_inplace.py,
# the GPU's own arch, every core; no pip): the package runs from this checkout through PYTHONPATH.
set -uo pipefail
out=${1:?usage: bash bench/gpu_checks.sh OUTDIR}
stages=${STAGES:-selftest test memcheck verify attn kv exit e2e demo ppd}
mkdir -p "$out"
cd "$(dirname "$0")/.."
status=0
py=${PYTHON:-python3}  # a device image may have python3 and no `python`
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
want() { [[ " $stages " == *" $1 "* ]]; }
cap() {  # a stage's timeout, shortened so that no stage runs past DEADLINE_S seconds after the script started
  local t=$1
  if [ -n "${DEADLINE_S:-}" ]; then
    local left=$((DEADLINE_S - SECONDS))
    [ "$left" -lt "$t" ] && t=$left
    [ "$t" -lt 1 ] && t=1
  fi
  echo "$t"
}

echo "== build" | tee "$out/summary.txt"
if ! $py bench/build_inplace.py >"$out/build.log" 2>&1; then
  tail -n 5 "$out/build.log" | tee -a "$out/summary.txt"
  echo "build failed (see build.log)" | tee -a "$out/summary.txt"
  exit 1
fi
tail -n 1 "$out/build.log" | tee -a "$out/summary.txt"
$py -c "import json, specdec_kernels; print(json.dumps(specdec_kernels.build_info(), indent=1))" >"$out/build_info.json"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/summary.txt"
$py -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)" 2>&1 \
  | tee -a "$out/summary.txt"

run_pytest() {
  # Parallel workers when pytest-xdist is there (Triton's JIT is CPU-bound); -v so a cut-off log still names each test;
  # a module that fails to import on this machine costs its own tests, not the run; through bench/gpu_pytest.py, a
  # test stuck past PYTEST_PER_TEST seconds (a kernel that never ends) costs that test, not the run.
  local par=()
  $py -c "import xdist" 2>/dev/null && par=(-n "${PYTEST_WORKERS:-8}")
  : >"$out/pytest_gpu.log"
  # shellcheck disable=SC2086  # PYTEST_ARGS: words, e.g. --gpu-tier full
  timeout "$(cap "${PYTEST_TIMEOUT:-540}")" $py bench/gpu_pytest.py --per-test "${PYTEST_PER_TEST:-240}" \
    --log "$out/pytest_gpu.log" --junitxml "$out/pytest_gpu.xml" -- -m gpu -v -p no:cacheprovider \
    --continue-on-collection-errors -rfEs ${par[@]+"${par[@]}"} ${PYTEST_ARGS:-} tests >/dev/null 2>&1
}
test_pid=""
if want test && [ "${TEST_ALONGSIDE:-0}" = 1 ]; then  # pytest -m gpu in the background, beside the selftest
  run_pytest &
  test_pid=$!
fi

if want selftest; then
  echo "== specdec-kernels selftest" | tee -a "$out/summary.txt"
  # shellcheck disable=SC2086
  timeout "$(cap "${SELFTEST_TIMEOUT:-540}")" $py -m specdec_kernels selftest ${SELFTEST_ARGS:-} --json "$out/selftest.json" \
    >"$out/selftest.txt" 2>&1
  rc=$?
  grep -E "^selftest: " "$out/selftest.txt" | tail -n 1 | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || { echo "selftest exit $rc (1: a check failed, 124: timed out; see selftest.txt)" | tee -a "$out/summary.txt"; status=1; }
fi

if want test; then
  echo "== pytest -m gpu" | tee -a "$out/summary.txt"
  if [ -n "$test_pid" ]; then wait "$test_pid"; rc=$?; else run_pytest; rc=$?; fi
  tail -n 3 "$out/pytest_gpu.log" | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || { echo "pytest exit $rc (124: timed out)" | tee -a "$out/summary.txt"; status=1; }
fi

if want memcheck; then
  echo "== compute-sanitizer memcheck (CUDA kernel tests, caching allocator off)" | tee -a "$out/summary.txt"
  cuda_tests=$(ls tests/test_gpu_*.py | grep -v -e statistics -e hf_models)
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "$(cap "${MEMCHECK_TIMEOUT:-480}")" compute-sanitizer --tool memcheck \
    --error-exitcode 9 --target-processes all $py -m pytest -q -x -p no:cacheprovider -m gpu \
    -k "${MEMCHECK_FILTER:-not graph and not 151936 and not 128256 and not long}" $cuda_tests >"$out/memcheck.log" 2>&1
  rc=$?
  grep -E "ERROR SUMMARY|passed|failed" "$out/memcheck.log" | tail -n 3 | tee -a "$out/summary.txt"
  [ $rc -eq 0 ] || status=1
fi

bench() {  # name, timeout, command...
  local name=$1 limit=$2
  shift 2
  echo "== $name" | tee -a "$out/summary.txt"
  timeout "$(cap "$limit")" "$@" --out "$out" >/dev/null 2>>"$out/summary.txt" || { echo "$name failed" | tee -a "$out/summary.txt"; status=1; }
}
# shellcheck disable=SC2086
want verify && bench bench_verify "${BENCH_TIMEOUT:-540}" $py bench/bench_verify.py ${BENCH_ARGS:-}
# shellcheck disable=SC2086
want attn && bench bench_tree_attention "${BENCH_TIMEOUT:-540}" $py bench/bench_tree_attention.py \
  ${ATTN_ARGS:---batch 8 32 --prefix 4096}
want kv && bench bench_kv_compact "${BENCH_TIMEOUT:-300}" $py bench/bench_kv_compact.py
want exit && bench bench_early_exit_topk "${BENCH_TIMEOUT:-300}" $py bench/bench_early_exit_topk.py
# shellcheck disable=SC2086
want e2e && bench e2e "${BENCH_TIMEOUT:-560}" $py bench/e2e.py \
  ${E2E_ARGS:---noise 0 0.1 0.5 --gammas 4 --max-new-tokens 96 --repeats 1 --method-timeout 120}
if want demo; then
  echo "== demo" | tee -a "$out/summary.txt"
  timeout "$(cap "${BENCH_TIMEOUT:-300}")" $py -m specdec_kernels demo --json "$out/demo.json" >"$out/demo.txt" 2>>"$out/summary.txt" \
    || { echo "demo failed" | tee -a "$out/summary.txt"; status=1; }
fi
want ppd && bench ppd_latency "${BENCH_TIMEOUT:-300}" $py bench/ppd_latency.py --device cuda
echo "== exit $status" | tee -a "$out/summary.txt"
exit $status
