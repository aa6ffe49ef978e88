#!/usr/bin/env bash
# The first look at a GPU in ONE device call: the most truth per minute, at most 8 files, <= 9 minutes.
#
#   bash bench/gpu_first_look.sh OUT              # on the GPU machine (timeout_s 600)
#   bash bench/gpu_first_look.sh --second OUT     # a second call: sanitizers, then the benchmark grids
#   bash bench/gpu_first_look.sh --dry-run OUT    # the same script on a CPU: stand-ins, tiny shapes (CI runs it)
#
# Stages, in the order of their value; each under its own `timeout`, each writing as it goes, so a stage
# that is killed still leaves what it checked; none runs past DEADLINE_S (default 530 s) after the start:
#   facts      GPU, driver, versions                                         -> summary.txt, facts.json
#   build      _C for this GPU's arch only, in place, every core; skipped when a matching _C imports (~25 s)
#   tests      pytest -m gpu -n <cores - 4> --timeout 150, in the background from here on (Triton's JIT
#              is CPU-bound; the kernels are small next to an H100's memory)  -> pytest_gpu.log, pytest_gpu.xml
#   cuda_ops   specdec-kernels selftest --backends cuda --no-engine: every op's CUDA kernel at small and
#              production shapes + a CUDA-graph replay, vs the torch reference (no JIT)  -> cuda_ops.jsonl
#   engine     specdec-kernels selftest --ops engine: every strategy on the default models, row by row vs HF
#              greedy of each prompt alone, graphs off and on (float32), graphs == eager (bfloat16), on
#              cuda then triton                                              -> engine.jsonl
#   probe      bench/gpu_probe.py with the GPU otherwise idle: the timings that decide what to optimise next
#                                                                            -> probe.jsonl
# Everything printed goes to log.txt. summary.txt gets a line per stage as it ends, then a digest
# (bench/first_look_summary.py): read it first.
#
# --second (what does not fit the first call): compute-sanitizer memcheck and racecheck over
# bench/cuda_sanitize_driver.py (every CUDA kernel once, tiny shapes), then the benchmark grids (verify,
# tree attention without Flex, kv_compact, early_exit_topk), each grid's rows as JSON lines.
# --dry-run: no build, no nvidia-smi, the selftest's CPU dev mode (Triton interpreted), pytest -m gpu
# collecting and skipping, the probe's --dry-run; the same file names, no timing claims.
set -uo pipefail
dry=0 second=0
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --second) second=1 ;;
    *) echo "gpu_first_look.sh: unknown option $1 (--dry-run, --second)" >&2; exit 2 ;;
  esac
  shift
done
out=${1:?usage: bash bench/gpu_first_look.sh [--dry-run] [--second] OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}  # the device image has python3 and no `python`
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
deadline=${DEADLINE_S:-530}
cores=$(nproc 2>/dev/null || echo 4)
workers=$((cores > 8 ? cores - 4 : 2))
log="$out/log.txt"
summary="$out/summary.txt"
: >"$summary"
: >"$log"
status=0

say() { echo "$*" | tee -a "$summary"; }
cap() {  # a stage's timeout, shortened so that it ends by the deadline
  local t=$1 left=$((deadline - SECONDS))
  [ "$left" -lt "$t" ] && t=$left
  [ "$t" -lt 1 ] && t=1
  echo "$t"
}
stage() {  # name, timeout, command...: runs it under timeout, one line in summary.txt; stdout to $stdout_to
  local name=$1 limit started=$SECONDS rc
  limit=$(cap "$2")
  shift 2
  echo "== $name (timeout ${limit} s): $*" >>"$log"
  timeout "$limit" "$@" >>"${stdout_to:-$log}" 2>>"$log"
  rc=$?
  local verdict=ok
  [ $rc -eq 0 ] || { verdict="exit $rc"; [ $rc -eq 124 ] && verdict="TIMED OUT after ${limit} s"; status=1; }
  say "$name: $verdict in $((SECONDS - started)) s"
  return $rc
}

mode=$([ $second = 1 ] && echo second || echo first)$([ $dry = 1 ] && echo ", dry run")
say "gpu_first_look ($mode) $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $cores cores"
if [ $dry = 1 ]; then
  export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
  say "dry run: CPU stand-ins, tiny shapes, Triton interpreted, no build; nothing here is a GPU result"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 1 | tee -a "$summary"
fi
$py -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)" 2>&1 \
  | tee -a "$summary"

if [ $dry = 1 ]; then
  say "build: skipped (dry run)"
else
  stage build 150 $py bench/build_inplace.py
fi
$py -c "import json, specdec_kernels; print(json.dumps(specdec_kernels.build_info(), indent=1))" >"$out/facts.json" 2>>"$log"

if [ $second = 1 ]; then
  # The sanitizers watch every CUDA kernel once; torch's cache off, so a stray write leaves every allocation.
  # Dry run: the driver's plumbing on the CPU with the torch backend, no sanitizer.
  for tool in memcheck racecheck; do
    if [ $dry = 1 ]; then
      stage "$tool" 60 $py bench/cuda_sanitize_driver.py --device cpu --backend torch
    else
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 stage "$tool" 150 compute-sanitizer --tool $tool --error-exitcode 9 \
        --print-limit 20 $py bench/cuda_sanitize_driver.py
    fi
  done
  # The grids' rows, one JSON line each as measured (a killed grid keeps its rows), -> OUT/<name>.jsonl;
  # their end-of-run .json/.md go to a scratch folder (8 files come back). Flex is left out: it compiles for minutes.
  grids=$(mktemp -d)
  smoke=$([ $dry = 1 ] && echo --smoke)
  if [ $dry = 1 ]; then
    verify_args=(--smoke) attn_args=(--smoke --impls triton sdpa)
  else
    # the ops never timed on a GPU first: a grid cut off by its stage timeout loses the ones measured before
    verify_args=(--batch 1 8 64 --vocab 151936 --repeats 50 --ops block_verify block_verify_logits
                 tree_rejection_sample_wr rejection_sample greedy_verify rejection_sample_logits relaxed_verify
                 bild_verify max_prob tree_greedy_verify tree_rejection_sample) attn_args=(--batch 8 32 --prefix 4096 --impls cuda triton sdpa)
  fi
  stdout_to="$out/verify.jsonl" stage verify 150 $py bench/bench_verify.py "${verify_args[@]}" --out "$grids"
  stdout_to="$out/tree_attention.jsonl" stage tree_attention 150 $py bench/bench_tree_attention.py "${attn_args[@]}" \
    --out "$grids"
  stdout_to="$out/kv_compact.jsonl" stage kv_compact 90 $py bench/bench_kv_compact.py $smoke --out "$grids"
  stdout_to="$out/early_exit_topk.jsonl" stage early_exit_topk 150 $py bench/bench_early_exit_topk.py $smoke \
    --out "$grids"
  rm -rf "$grids"
  $py bench/first_look_summary.py "$out" >>"$summary" 2>>"$log" || say "(the digest failed: see log.txt)"
  say "== exit $status after $SECONDS s"
  exit $status
fi

if [ $dry = 1 ]; then
  selftest=($py -m specdec_kernels selftest --device cpu)
  cuda_ops=(--ops greedy_verify,tree_greedy_verify,kv_compact --backends triton --no-engine)
  engine_backends=()
  probe=(--dry-run)
  par=()
else
  selftest=($py -m specdec_kernels selftest)
  cuda_ops=(--backends cuda --no-engine)
  engine_backends=(--backends cuda,triton)
  probe=()
  par=(-n "$workers" --timeout "${PYTEST_PER_TEST:-150}")
fi
$py -c "import xdist, pytest_timeout" 2>/dev/null || par=()

say "tests: pytest -m gpu ${par[*]+${par[*]}} started in the background"
started_tests=$SECONDS
timeout "$(cap 330)" $py -m pytest -m gpu -v -p no:cacheprovider --continue-on-collection-errors -rfEs \
  ${par[@]+"${par[@]}"} --junitxml "$out/pytest_gpu.xml" tests >"$out/pytest_gpu.log" 2>&1 &
tests_pid=$!

stage cuda_ops 150 "${selftest[@]}" "${cuda_ops[@]}" --jsonl "$out/cuda_ops.jsonl"
stage engine 150 "${selftest[@]}" --ops engine ${engine_backends[@]+"${engine_backends[@]}"} --jsonl "$out/engine.jsonl"

wait "$tests_pid"
rc=$?
verdict=ok
[ $rc -eq 0 ] || { verdict="exit $rc"; [ $rc -eq 124 ] && verdict="TIMED OUT"; status=1; }
say "tests: $verdict in $((SECONDS - started_tests)) s: $(tail -n 1 "$out/pytest_gpu.log")"

left=$((deadline - SECONDS - 20))
stage probe 150 $py bench/gpu_probe.py ${probe[@]+"${probe[@]}"} --budget "$((left > 10 ? left : 10))" \
  --out "$out/probe.jsonl"

$py bench/first_look_summary.py "$out" >>"$summary" 2>>"$log" || say "(the digest failed: see log.txt)"
say "== exit $status after $SECONDS s"
exit $status
