#!/usr/bin/env bash
# The GPU calls of a short window, each planned like a launch: <= 9 minutes, <= 8 files in OUT, each file
# written as it goes, every stage under its own `timeout` inside its budget.
#
#   bash bench/gpu_first_look.sh OUT            # the first call: what changed since the last GPU run, then what
#                                               # a user feels (timeout_s 600)
#   bash bench/gpu_first_look.sh --second OUT   # next: the full `pytest -m gpu`, compute-sanitizer memcheck + racecheck
#   bash bench/gpu_first_look.sh --grids OUT    # then: the benchmark grids and the end-to-end sweep
#   bash bench/gpu_first_look.sh --dry-run [--second | --grids] OUT   # the same on a CPU (CI): stand-ins, tiny
#                                               # shapes, the same stages and file names, no timing claims; a
#                                               # stand-in test that hangs shows a hang costing one test
#
# First call (budgets in PLAN below; they sum to <= 540 s, DEADLINE_S ends every stage by then):
#   facts        GPU, driver, versions; the kernels changed since the newest committed GPU results
#                (bench/gpu_changes.py: new ones first)                         -> summary.txt, facts.json
#   build        _C for this GPU's arch only, in place, every core; skipped when a matching _C imports
#   selftest     correctness of what has not run on a GPU first: selftest --quick on the changed ops (new first),
#                a control sample of the unchanged ones, then the engine check (every strategy vs HF greedy);
#                the CUDA tree sampler in both forms; a check hung past its watchdog fails and the next op runs
#                                                                               -> selftest.jsonl
#   tests        beside the selftest, in the background on cores - 4 workers: pytest -m gpu --gpu-focus <changed
#                kernels> (their quick tier; a control sample of the others), both tree forms, through
#                bench/gpu_pytest.py: a test hung past its limit is killed, failed, and the rest run on
#                                                                               -> pytest_gpu.log, pytest_gpu.xml
#   memcheck     compute-sanitizer memcheck of the changed CUDA kernels only: 2 tiny cases an op, both tree forms
#                                                                               -> log.txt
#   probe        bench/gpu_probe.py, the GPU otherwise idle: L2 flushed, % of bench/_bound.py's bound, the new
#                ops first, tree_attention at 2 shapes beside SDPA              -> probe.jsonl
#   e2e          bench/e2e.py, TinyLlama-1.1B-shaped synthetic aligned pair, bf16, graphs on, batch 1 and 8,
#                greedy and sampling, acceptance ~1 (noise 0) and ~0.7 (noise 0.04): ours_plain, ours_spec
#                (chain and a 3,12 tree), HF dynamic greedy; then HF static-cache compiled greedy, its compile
#                under what is left (a timeout is a row)                       -> e2e.jsonl
#   digest       bench/first_look_summary.py: every stage's counts, failures, timings -> summary.txt
# --second: facts, build, then compute-sanitizer memcheck and racecheck over bench/cuda_sanitize_driver.py (every
#   CUDA kernel once) while `pytest -m gpu --gpu-tier full` runs beside them on cores - 2 workers
#                                                                               -> pytest_gpu.log, pytest_gpu.xml
# --grids: facts, build, the benchmark grids (verify, tree attention without Flex, kv_compact, early_exit_topk)
#   and an e2e sweep, each grid's rows as JSON lines                         -> <grid>.jsonl, e2e.jsonl
# Everything printed goes to log.txt. summary.txt: the plan, a line per stage as it ends (its time against its
# budget, its rows), the digest, and the call to run next. Read it first.
set -uo pipefail
dry=0 call=first
while [[ "${1:-}" == --* ]]; do
  case "$1" in
    --dry-run) dry=1 ;;
    --second) call=second ;;
    --grids) call=grids ;;
    *) echo "gpu_first_look.sh: unknown option $1 (--dry-run, --second, --grids)" >&2; exit 2 ;;
  esac
  shift
done
out=${1:?usage: bash bench/gpu_first_look.sh [--dry-run] [--second | --grids] OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}  # the device image has python3 and no `python`
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
deadline=${DEADLINE_S:-540}
cores=$(nproc 2>/dev/null || echo 4)
workers=$((cores > 8 ? cores - 4 : 2))
log="$out/log.txt"
summary="$out/summary.txt"
: >"$summary"
: >"$log"
status=0

# Each call's stages and their budgets in seconds, in order. Branches joined by "|" run side by side (the wall
# they take is the longest branch); "+" chains stages inside a branch. The wall must fit the 540 s of a call.
declare -A PLAN=(
  [first]="facts:15 build:60 selftest:170|tests:170 memcheck:40 probe:110 e2e:140 digest:5"
  [second]="facts:15 build:60 memcheck:150+racecheck:150|tests:450 digest:5"
  [grids]="facts:15 build:60 verify:100 tree_attention:90 kv_compact:40 early_exit_topk:60 e2e:165 digest:5"
)
declare -A NEXT=(
  [first]="bash bench/gpu_first_look.sh --second OUT (the full pytest -m gpu and the sanitizers)"
  [second]="bash bench/gpu_first_look.sh --grids OUT (the benchmark grids and the e2e sweep)"
  [grids]="none planned: commit the three calls' files under bench/results/ and fix on the CPU what they show"
)
budget() {  # the budget of stage $1 in this call's plan
  local item plan=${PLAN[$call]//|/ }
  for item in ${plan//+/ }; do
    [ "${item%%:*}" = "$1" ] && { echo "${item##*:}"; return; }
  done
  echo 0
}
plan_line() {  # "facts 15 s, build 60 s, selftest 170 s | tests 170 s, ... = N s of wall (deadline D s)"
  local group branch item total=0 wall longest text=""
  for group in ${PLAN[$call]}; do
    longest=0
    for branch in ${group//|/ }; do
      wall=0
      for item in ${branch//+/ }; do wall=$((wall + ${item##*:})); done
      [ $wall -gt $longest ] && longest=$wall
    done
    total=$((total + longest))
    text+="${text:+, }$(echo "$group" | sed 's/:\([0-9]*\)/ \1 s/g; s/|/ | /g; s/+/ + /g')"
  done
  echo "plan (stage budget): $text = $total s of wall (deadline $deadline s)"
}

say() { echo "$*" | tee -a "$summary"; }
cap() {  # a stage's timeout: its budget, shortened so that it ends by the deadline
  local t=$1 left=$((deadline - SECONDS))
  [ "$left" -lt "$t" ] && t=$left
  [ "$t" -lt 1 ] && t=1
  echo "$t"
}
rows_in() {  # "N rows in FILE" for the files a stage writes
  local file text="" n
  for file in "$@"; do
    n=$(grep -c . "$out/$file" 2>/dev/null)
    text+="${text:+, }${n:-0} rows in $file"
  done
  echo "$text"
}
verdict_of() {  # rc, limit -> ok | exit N | TIMED OUT after N s (called in $(...): the caller sets status)
  local rc=$1
  [ "$rc" -eq 0 ] && { echo ok; return; }
  [ "$rc" -eq 124 ] && { echo "TIMED OUT after $2 s"; return; }
  echo "exit $rc"
}
stage() {  # name, timeout, rows files ("a b"), command...: runs it under timeout, one line in summary.txt
  local name=$1 limit started=$SECONDS rc files=$3
  limit=$(cap "$2")
  shift 3
  echo "== $name (timeout ${limit} s): $*" >>"$log"
  timeout "$limit" "$@" >>"${stdout_to:-$log}" 2>>"$log"
  rc=$?
  [ "$rc" -eq 0 ] || status=1  # here, not in verdict_of: a subshell's assignment is lost
  # shellcheck disable=SC2086
  say "$name: $(verdict_of $rc "$limit") in $((SECONDS - started)) s (budget $(budget "$name") s)\
${files:+: $(rows_in $files)}"
  return $rc
}
tests_line() {  # what pytest's junit file (or its -v log, when cut off) counts
  if [ -f "$out/pytest_gpu.xml" ]; then
    $py -c "import sys, xml.etree.ElementTree as E; s = E.parse(sys.argv[1]).getroot(); \
print(sum(int(x.get('tests', 0)) for x in s.iter('testsuite')), 'rows in pytest_gpu.xml (tests)')" \
      "$out/pytest_gpu.xml" 2>/dev/null || echo "pytest_gpu.xml unreadable"
  else
    local n
    n=$(grep -cE ' (PASSED|FAILED|SKIPPED|ERROR)' "$out/pytest_gpu.log" 2>/dev/null)
    echo "${n:-0} rows in pytest_gpu.log (cut off before its junit file)"
  fi
}
start_tests() {  # pytest arguments...: pytest -m gpu in the background, its pid in $tests_pid. Through
  # bench/gpu_pytest.py: a test past PYTEST_PER_TEST seconds (a kernel that never ends) is killed, counted as a
  # failure, and pytest goes on without it (a per-test timeout inside pytest cannot end a stuck CUDA call)
  local limit
  limit=$(cap "$(budget tests)")
  say "tests: pytest -m gpu $(echo "$*" | sed -E 's/(--gpu-focus) ([^ ]{60})[^ ]+/\1 \2.../') ${par[*]+${par[*]}} \
started in the background (timeout $limit s, $per_test s a test)"
  tests_started=$SECONDS
  : >"$out/pytest_gpu.log"
  timeout "$limit" $py bench/gpu_pytest.py --per-test "$per_test" --log "$out/pytest_gpu.log" \
    --junitxml "$out/pytest_gpu.xml" ${stand_in[@]+"${stand_in[@]}"} -- -m gpu -v -p no:cacheprovider \
    --continue-on-collection-errors -rfEs ${par[@]+"${par[@]}"} "$@" tests >>"$log" 2>&1 &
  tests_pid=$!
}
wait_tests() {
  wait "$tests_pid"
  local rc=$?
  [ "$rc" -eq 0 ] || status=1
  say "tests: $(verdict_of $rc "$(budget tests)") in $((SECONDS - tests_started)) s (budget $(budget tests) s): \
$(tests_line); $(tail -n 1 "$out/pytest_gpu.log")"
}
finish() {
  local started=$SECONDS
  $py bench/first_look_summary.py --call "$call" "$out" >>"$summary" 2>>"$log" || say "(the digest failed: see log.txt)"
  say "digest: done in $((SECONDS - started)) s (budget $(budget digest) s)"
  say "next: ${NEXT[$call]}"
  say "== exit $status after $SECONDS s"
  exit $status
}

mode="$call$([ $dry = 1 ] && echo ", dry run")"
say "gpu_first_look ($mode) $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(hostname), $cores cores"
say "$(plan_line)"
if [ $dry = 1 ]; then
  export CUDA_VISIBLE_DEVICES="" TRITON_INTERPRET=1
  say "dry run: CPU stand-ins, tiny shapes, Triton interpreted, no build; nothing here is a GPU result"
fi
# the kernels this call's selftest verifies go into a record of its own (common/kernel_trust.py), which the
# probe and e2e then read: `auto` there picks what a user's would after this selftest, nothing of the machine's
export SPECDEC_KERNELS_CACHE_DIR="${SPECDEC_KERNELS_CACHE_DIR:-$(mktemp -d)}"

# facts: the machine, the versions, and what changed since the newest committed GPU results
started=$SECONDS
[ $dry = 1 ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -n 1 \
  | tee -a "$summary"
$py -c "import sys, torch, triton, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'triton', triton.__version__, 'transformers', transformers.__version__)" 2>&1 \
  | tee -a "$summary"
$py bench/gpu_changes.py 2>>"$log" | sed 's/^/  /' | tee -a "$summary"
# changed_ops (new first), control_ops (unchanged), focus (changed kernels as op/backend); if that fails, every
# kernel counts as changed: the selftest takes every op, pytest the whole quick tier, memcheck every CUDA op
if lists=$($py bench/gpu_changes.py --shell 2>>"$log"); then
  eval "$lists"
  selftest_ops=(--ops "${changed_ops:+$changed_ops,}engine" ${control_ops:+--control-ops "$control_ops"})
  focus_args=(--gpu-focus "$focus")  # empty: nothing changed, every kernel gets its control sample
  memcheck_ops=$(echo "$focus" | tr , '\n' | grep '/cuda$' | cut -d/ -f1 | paste -sd, -)
  memcheck_args=(--ops "${memcheck_ops:-none}")
else
  say "facts: bench/gpu_changes.py failed (see log.txt): every kernel counts as changed"
  selftest_ops=() focus_args=() memcheck_args=()
fi
say "facts: done in $((SECONDS - started)) s (budget $(budget facts) s)"

if [ $dry = 1 ]; then
  say "build: skipped (dry run) (budget $(budget build) s)"
else
  stage build "$(budget build)" "" $py bench/build_inplace.py
fi
# facts.json: the build as it loads now, and the record of the kernels this call runs (the next call's baseline
# once these files are committed under bench/results/)
$py -c "import json, sys; sys.path.insert(0, 'bench'); import gpu_changes, specdec_kernels; \
json.dump({**specdec_kernels.build_info(), **gpu_changes.facts()}, open(sys.argv[1], 'w'), indent=1)" \
  "$out/facts.json" 2>>"$log"

# xdist workers: cores - 4 beside the selftest's Triton compiles; cores - 2 beside the sanitizers (GPU-bound)
[ $call = second ] && workers=$((cores > 8 ? cores - 2 : 2))
par=() stand_in=()
[ $dry = 1 ] || par=(-n "$workers")
$py -c "import xdist" 2>/dev/null || par=()
per_test=${PYTEST_PER_TEST:-150}
# the dry run's stand-in test hangs first (bench/stand_in_hang.py): killed after a few seconds, the rest runs
[ $dry = 1 ] && [ $call = first ] && stand_in=(--stand-in-hang) && per_test=${PYTEST_PER_TEST:-15}

if [ $call = second ]; then
  start_tests --gpu-tier full
  # The sanitizers watch every CUDA kernel once; torch's cache off, so a stray write leaves every allocation.
  # Dry run: the driver's plumbing on the CPU with the torch backend, no sanitizer.
  for tool in memcheck racecheck; do
    if [ $dry = 1 ]; then
      stage "$tool" "$(budget $tool)" "" $py bench/cuda_sanitize_driver.py --device cpu --backend torch
    else
      PYTORCH_NO_CUDA_MEMORY_CACHING=1 stage "$tool" "$(budget $tool)" "" compute-sanitizer --tool $tool \
        --error-exitcode 9 --print-limit 20 $py bench/cuda_sanitize_driver.py --forms split,cluster
    fi
  done
  wait_tests
  finish
fi

if [ $call = grids ]; then
  # The grids' rows, one JSON line each as measured (a killed grid keeps its rows), -> OUT/<name>.jsonl; their
  # end-of-run .json/.md/.png go to a scratch folder (8 files come back). Flex is left out: it compiles for minutes.
  grids=$(mktemp -d)
  if [ $dry = 1 ]; then
    # a slice of the smoke grid: the dry run checks the plumbing (tests/test_bench_and_examples.py runs the whole
    # smoke grid), and the interpreter on 2 cores needs more than the GPU's 100 s for all of it
    verify_args=(--smoke --batch 1 --ops block_verify rejection_sample tree_rejection_sample)
    attn_args=(--smoke --impls triton sdpa) smoke=(--smoke)
    e2e_args=(--device cpu --smoke --no-default --methods ours_plain ours_plain_draft hf_dynamic ours_spec)
  else
    # the ops never timed on a GPU first: a grid cut off by its stage timeout loses the ones measured last
    verify_args=(--batch 1 8 64 --vocab 151936 --repeats 50 --ops block_verify block_verify_logits
                 tree_rejection_sample_wr rejection_sample greedy_verify rejection_sample_logits relaxed_verify
                 bild_verify max_prob tree_greedy_verify tree_rejection_sample)
    attn_args=(--batch 8 32 --prefix 4096 --impls cuda triton sdpa) smoke=()
    e2e_args=(--noise 0 0.02 0.04 0.1 --batch-sizes 1 4 16 --gammas 2 4 6 --graph-modes on --hf-modes greedy
              --methods ours_plain ours_plain_draft hf_dynamic ours_spec --no-default --max-new-tokens 64)
  fi
  stdout_to="$out/verify.jsonl" stage verify "$(budget verify)" verify.jsonl \
    $py bench/bench_verify.py "${verify_args[@]}" --out "$grids"
  stdout_to="$out/tree_attention.jsonl" stage tree_attention "$(budget tree_attention)" tree_attention.jsonl \
    $py bench/bench_tree_attention.py "${attn_args[@]}" --out "$grids"
  stdout_to="$out/kv_compact.jsonl" stage kv_compact "$(budget kv_compact)" kv_compact.jsonl \
    $py bench/bench_kv_compact.py ${smoke[@]+"${smoke[@]}"} --out "$grids"
  stdout_to="$out/early_exit_topk.jsonl" stage early_exit_topk "$(budget early_exit_topk)" early_exit_topk.jsonl \
    $py bench/bench_early_exit_topk.py ${smoke[@]+"${smoke[@]}"} --out "$grids"
  stage e2e "$(( $(cap $((deadline - SECONDS - 10))) ))" e2e.jsonl \
    $py bench/e2e.py "${e2e_args[@]}" --jsonl "$out/e2e.jsonl" --out "$grids"
  rm -rf "$grids"
  finish
fi

# ---- the first call
if [ $dry = 1 ]; then
  # the same plumbing at the CPU dev mode's cost: the first two changed ops, one control op, the engine
  selftest=($py -m specdec_kernels selftest --device cpu --watchdog 240)
  control_ops=${control_ops:-kv_compact}
  selftest_ops=(--ops "$(echo "${changed_ops:+$changed_ops,}engine" | cut -d, -f1-2),engine"
                --control-ops "$(echo "$control_ops" | cut -d, -f1)")
  memcheck=($py bench/cuda_sanitize_driver.py --device cpu --backend torch)
else
  selftest=($py -m specdec_kernels selftest --watchdog "${SELFTEST_WATCHDOG:-60}")  # a hang costs one op
  memcheck=(compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 $py bench/cuda_sanitize_driver.py)
fi
start_tests ${focus_args[@]+"${focus_args[@]}"}
stage selftest "$(budget selftest)" selftest.jsonl "${selftest[@]}" --quick ${selftest_ops[@]+"${selftest_ops[@]}"} \
  --jsonl "$out/selftest.jsonl"
wait_tests

# memcheck of the changed CUDA kernels only, each tree form: what the GPU has never run, watched for
# out-of-bounds and misaligned accesses (torch's cache off, so a stray write leaves every allocation)
PYTORCH_NO_CUDA_MEMORY_CACHING=1 stage memcheck "$(budget memcheck)" "" "${memcheck[@]}" \
  ${memcheck_args[@]+"${memcheck_args[@]}"} --cases-per-op 2 --forms split,cluster

stage probe "$(budget probe)" probe.jsonl $py bench/gpu_probe.py $([ $dry = 1 ] && echo --dry-run) \
  --budget "$(( $(budget probe) - 15 ))" --out "$out/probe.jsonl"

# e2e: the rows a GPU user asks for first, then HF's compiled static cache with whatever time is left
scratch=$(mktemp -d)
if [ $dry = 1 ]; then
  e2e_common=(--device cpu --smoke) noise=(0 0.3) tree=2,6
else
  e2e_common=(--batch-sizes 1 8 --gammas 4 --max-new-tokens 64 --repeats 3) noise=(0 0.04) tree=3,12
fi
e2e_started=$SECONDS
e2e_limit=$(cap $((deadline - SECONDS - 10)))  # its budget and whatever the stages before it left
timeout "$e2e_limit" $py bench/e2e.py "${e2e_common[@]}" --noise "${noise[@]}" --no-default --graph-modes on \
  --hf-modes greedy --methods ours_plain ours_plain_draft hf_dynamic ours_spec ours_spec_tree --trees $tree \
  --jsonl "$out/e2e.jsonl" --out "$scratch" >>"$log" 2>&1
e2e_rc=$?
left=$((e2e_limit - (SECONDS - e2e_started)))
if [ "$left" -gt 30 ]; then  # HF static cache, compiled on a GPU: each batch size's compile capped (a timeout is a row)
  per_batch=$(( (left - 20) / 2 ))
  timeout "$left" $py bench/e2e.py "${e2e_common[@]}" --noise 0 --no-default --modes greedy \
    --methods hf_static --method-timeout "$per_batch" --jsonl "$out/e2e.jsonl" --out "$scratch" >>"$log" 2>&1
  static_rc=$?
  [ $e2e_rc -eq 0 ] && e2e_rc=$static_rc
else
  echo '{"method": "hf_static", "status": "skipped", "error": "no time left in the e2e stage"}' >>"$out/e2e.jsonl"
fi
rm -rf "$scratch"
say "e2e: $(verdict_of $e2e_rc "$e2e_limit") in $((SECONDS - e2e_started)) s (budget $(budget e2e) s): \
$(rows_in e2e.jsonl)"
finish
