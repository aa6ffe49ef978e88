#!/usr/bin/env bash
# Every GPU check the issues owe, in one device call (the machine starts bare):
#   build _C, `pytest -m gpu`, compute-sanitizer memcheck over the CUDA kernels' GPU tests,
#   and the verification microbenchmark. Results land in OUT (at most 6 files, one folder).
#
#   bash bench/gpu_checks.sh "$OUT"                      # everything (about 10 minutes on an H100)
#   BENCH_ARGS="--ops rejection_sample greedy_verify" bash bench/gpu_checks.sh "$OUT"
#   SKIP_BENCH=1 bash bench/gpu_checks.sh "$OUT"
set -uo pipefail
out=${1:?usage: bash bench/gpu_checks.sh OUTDIR}
mkdir -p "$out"
cd "$(dirname "$0")/.."
status=0

echo "== build" | tee "$out/summary.txt"
if ! SPECDEC_REQUIRE_CUDA=1 pip install --no-build-isolation --no-deps -e . -q >"$out/build.log" 2>&1; then
  echo "build failed (see build.log)" | tee -a "$out/summary.txt"
  exit 1
fi
python -c "import json, specdec_kernels; print(json.dumps(specdec_kernels.build_info(), indent=1))" >"$out/build_info.json"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$out/summary.txt"

echo "== pytest -m gpu" | tee -a "$out/summary.txt"
timeout "${PYTEST_TIMEOUT:-420}" python -m pytest -m gpu -q -p no:cacheprovider -rs >"$out/pytest_gpu.log" 2>&1
rc=$?
tail -n 3 "$out/pytest_gpu.log" | tee -a "$out/summary.txt"
[ $rc -eq 0 ] || status=1

echo "== compute-sanitizer memcheck (CUDA kernel tests, caching allocator off)" | tee -a "$out/summary.txt"
cuda_tests=$(ls tests/test_gpu_*.py | grep -v statistics)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${MEMCHECK_TIMEOUT:-420}" compute-sanitizer --tool memcheck \
  --error-exitcode 9 --target-processes all python -m pytest -q -x -p no:cacheprovider -m gpu \
  -k "${MEMCHECK_FILTER:-not graph and not 151936 and not 128256}" $cuda_tests >"$out/memcheck.log" 2>&1
rc=$?
grep -E "ERROR SUMMARY|passed|failed" "$out/memcheck.log" | tail -n 3 | tee -a "$out/summary.txt"
[ $rc -eq 0 ] || status=1

if [ -z "${SKIP_BENCH:-}" ]; then
  echo "== bench_verify" | tee -a "$out/summary.txt"
  # shellcheck disable=SC2086
  timeout "${BENCH_TIMEOUT:-900}" python bench/bench_verify.py --out "$out" ${BENCH_ARGS:-} >/dev/null 2>>"$out/summary.txt" || status=1
fi
echo "== exit $status" | tee -a "$out/summary.txt"
exit $status
