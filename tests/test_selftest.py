"""`specdec-kernels selftest` tested on the CPU: the no-GPU message and exit code, the dev mode
(`--device cpu`: tiny shapes, Triton under the interpreter) passing with a JSON matrix, the case
builders of the GPU shapes, and broken backends that must be reported as failures (mutations).
The GPU run itself is what `bench/gpu_checks.sh` (stage selftest) owes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdec_kernels import cli, ops, reference, selftest
from specdec_kernels.common import registry
from specdec_kernels.demo import rows as demo_rows
from specdec_kernels.selftest import runner

ROOT = Path(__file__).resolve().parent.parent


def tiny_cases(op):
    """The catalog's cases of `op` at the CPU dev mode's profile."""
    return [case for family in selftest.CASE_FAMILIES for case in family("tiny", torch.device("cpu")) if case.op == op]


def run_command(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "specdec_kernels", "selftest", *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=timeout)


def test_without_a_gpu_it_says_so_and_exits_2():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # no GPU visible even on a GPU machine
    out = run_command(env=env)
    assert out.returncode == selftest.EXIT_NO_GPU == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == selftest.NO_GPU
    assert out.stdout == ""


def test_dev_mode_subset_passes_and_writes_the_matrix(tmp_path):
    """A fresh process without TRITON_INTERPRET: the command re-runs itself under the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["CUDA_VISIBLE_DEVICES"] = ""
    path, lines = tmp_path / "selftest.json", tmp_path / "selftest.jsonl"
    # the kernel families' catalog cases run in tests/test_triton_*.py (check_case judges them as the selftest does):
    # here one Triton op, one torch-only op and the engine, for the dev mode's own machinery
    out = run_command("--device", "cpu", "--ops", "greedy_verify,kv_rollback,engine",
                      "--json", str(path), "--jsonl", str(lines), env=env,
                      timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    result = json.loads(path.read_text())
    assert result["summary"]["ok"] and result["summary"]["finished"] and result["summary"]["failed"] == 0
    assert result["header"]["profile"] == "tiny" and result["header"]["torch"] == torch.__version__
    matrix = result["matrix"]
    assert set(matrix) == {"greedy_verify", "kv_rollback", "engine"}
    assert matrix["greedy_verify"]["triton"]["pass"] == len(tiny_cases("greedy_verify"))  # interpreted Triton
    assert matrix["kv_rollback"]["torch"]["pass"] >= 1
    # every row of the demo (each strategy of the table, its tree form too) vs HF greedy of each prompt
    # alone; the bfloat16 graphs-vs-eager check needs CUDA graphs
    assert matrix["engine"]["torch"] == {"pass": len(demo_rows()), "fail": 0, "skip": 1}
    assert all(check["status"] == "pass" for check in result["checks"] if check["dtype"] != "bfloat16")
    logged = [json.loads(line) for line in lines.read_text().splitlines()]
    assert logged[0]["header"] == result["header"] and logged[1:] == result["checks"]
    assert "selftest: " in out.stdout and ": PASS" in out.stdout and "op " in out.stdout


def test_every_op_and_backend_has_cases_at_every_profile():
    device = torch.device("cpu")
    for profile in ("tiny", "quick", "full"):
        cases = [case for family in selftest.CASE_FAMILIES for case in family(profile, device)]
        assert {case.op for case in cases} == set(ops.registered_ops()), profile
        dtypes = {case.dtype for case in cases if case.op in ("greedy_verify", "tree_attention", "kv_compact")}
        assert dtypes == set(selftest.DTYPES) or profile == "tiny"
    full = [case.name for family in selftest.CASE_FAMILIES for case in family("full", device)]
    for needle in ("V=151936", "B=256", "N=64", "P<=4096", "D=64", "D=128", "paged16", "one allocation",
                   "per-layer tensors"):
        assert any(needle in name for name in full), needle


def test_quick_shape_builders_agree_with_themselves():
    """The GPU run's small cases, built on the CPU: every builder makes valid inputs for the op (the
    reference accepts them) and every comparator accepts the reference's own answer."""
    cpu = torch.device("cpu")
    plan = selftest.Plan(device=cpu, profile="quick", backends=(), explicit_backends=False, ops=(), graphs=False,
                         engine=False, seed=0)
    seen = set()
    for family in selftest.CASE_FAMILIES:
        for case in family("quick", cpu):
            key = (case.op, case.dtype)
            if key in seen:  # one case per op and dtype keeps this quick on 2 cores
                continue
            seen.add(key)
            inputs = case.build(plan.seed)
            want = case.reference(inputs) if case.reference else case.run(inputs, "torch")
            error, problem = case.compare(tuple(t.clone() for t in want), want, inputs)
            assert problem is None and error == 0.0, (case.op, case.name, problem)
    assert len({op for op, _ in seen}) == len(ops.registered_ops())


def test_graph_cases_rebuild_to_the_same_shapes():
    """A captured graph is replayed on another seed's values copied into its inputs: every seed
    must give the same shapes (and the same Python parameters, which the launch bakes in)."""
    cpu = torch.device("cpu")
    graph_cases = [case for family in selftest.CASE_FAMILIES for case in family("quick", cpu) if case.graph]
    assert {case.op for case in graph_cases} == set(ops.registered_ops())
    for case in graph_cases:
        first, second = case.build(101), case.build(202)
        assert first.keys() == second.keys()
        for name, value in first.items():
            other = second[name]
            if isinstance(value, torch.Tensor):
                assert value.shape == other.shape and value.dtype == other.dtype, (case.op, name)
            elif isinstance(value, list):
                assert [t.shape for t in value] == [t.shape for t in other], (case.op, name)
            elif name != "rollback_threshold":  # bild's comparison excuses a replay's threshold-band rows
                assert value == other, (case.op, name)
        runner._copy_into(first, second)
        for name, value in first.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                assert torch.equal(value.nan_to_num(), second[name].nan_to_num()), (case.op, name)


def eager_capture(device, fn):
    """A stand-in for CUDA-graph capture on the CPU: replay re-runs fn into the captured outputs."""
    outputs = fn()

    def replay():
        for old, new in zip(outputs, fn()):
            old.copy_(new)
    return outputs, replay


def baked_capture(device, fn):
    """A broken capture: replay computes nothing new (as if the inputs had been baked in)."""
    return fn(), lambda: None


@pytest.mark.parametrize("capture,ok", [(eager_capture, True), (baked_capture, False)], ids=["replays", "baked"])
def test_graph_check_logic_on_the_cpu(capture, ok):
    """Every op's graph case through run_case with a stand-in capture: a replay that follows the new
    inputs passes; one that does not is a failure of the graph check only."""
    cpu = torch.device("cpu")
    plan = selftest.Plan(device=cpu, profile="tiny", backends=(), explicit_backends=False, ops=(), graphs=True,
                         engine=False, seed=0, capture=capture)
    graph_cases = [case for family in selftest.CASE_FAMILIES for case in family("tiny", cpu) if case.graph]
    assert {case.op for case in graph_cases} == set(ops.registered_ops())
    for case in graph_cases:
        results = selftest.run_case(plan, case, ("torch",))
        eager = [r for r in results if not r.case.endswith(" graph")]
        graph = [r for r in results if r.case.endswith(" graph")]
        assert [r.status for r in eager] == ["pass"] and len(graph) == 1, (case.op, results)
        assert graph[0].status == ("pass" if ok else "fail"), (case.op, graph[0])
        if not ok:
            assert graph[0].message.startswith("replay vs reference"), graph[0].message


class ReplayingGraphs:
    """decoding.graphs' backend without a GPU: capture keeps the step, replay runs it again."""

    def available(self):
        return True

    def stream(self, device):
        return None

    def warm_up(self, stream, fn, inputs):
        return fn(*inputs)

    def capture(self, stream, fn, inputs):
        return fn, inputs

    def replay(self, graph):
        fn, inputs = graph
        return fn(*inputs)


def _engine_plan():
    return selftest.Plan(device=torch.device("cpu"), profile="tiny", backends=("torch",), explicit_backends=False,
                         ops=("engine",), graphs=True, engine=True, seed=0)


def test_engine_check_runs_graphs_and_bfloat16_where_graphs_run():
    """With a graph backend (a stand-in here), every strategy runs eager and with graphs in float32 against
    HF per prompt, and graphs against eager in bfloat16."""
    from specdec_kernels.decoding import graphs
    from specdec_kernels.selftest import engine

    results = []
    graphs.clear_graph_cache()
    try:
        with graphs.use_backend(ReplayingGraphs()):
            engine.run_engine(_engine_plan(), ("torch",), results.append)
    finally:
        graphs.clear_graph_cache()
    cases = [r.case for r in results if r.dtype == "float32"]
    assert all(r.status == "pass" for r in results), [(r.case, r.message) for r in results if r.status != "pass"]
    assert sum("eager B=3" in c for c in cases) == sum("cuda graphs B=3" in c for c in cases) == len(demo_rows())
    assert sum(r.dtype == "bfloat16" and "graphs vs eager" in r.case for r in results) == len(demo_rows())


def test_engine_check_names_the_row_that_differs_from_its_prompt_alone(monkeypatch):
    """Mutation: HF's lone-prompt greedy of row 1 changed at token 3: every strategy fails on that row."""
    from specdec_kernels.selftest import engine

    real = engine.solo_greedy

    def shifted(*args, **kwargs):
        rows = real(*args, **kwargs)
        rows[1] = rows[1].clone()
        rows[1][3] += 1
        return rows

    monkeypatch.setattr(engine, "solo_greedy", shifted)
    results = []
    engine.run_engine(_engine_plan(), ("torch",), results.append)
    failed = [r for r in results if r.status == "fail"]
    assert len(failed) == len(demo_rows()), [(r.case, r.status) for r in results]
    assert all("1 of 3 rows differ" in r.message and "row 1: first differs at new token 3" in r.message
               for r in failed), failed[0].message


def _run_in_process(monkeypatch, capsys, *args):
    # Stays in this process (no re-run under the interpreter): the broken backends run no Triton kernel,
    # and the op beside them is kv_rollback (torch only), so this also holds on a GPU machine.
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    status = cli.main(["selftest", "--device", "cpu", "--no-engine", *args])
    return status, capsys.readouterr()


def _break(monkeypatch, op, fn):
    monkeypatch.setitem(registry._IMPLS[op], "triton", fn)


def test_a_wrong_token_is_a_failure(monkeypatch, capsys, tmp_path):
    def off_by_one(target_logits, draft_tokens, *, num_draft_tokens=None):
        tokens, accepted = reference.greedy_verify(target_logits, draft_tokens, num_draft_tokens=num_draft_tokens)
        tokens = tokens.clone()
        tokens[-1, 0] = (tokens[-1, 0] + 1) % target_logits.shape[-1]  # one token of one row
        return tokens, accepted

    _break(monkeypatch, "greedy_verify", off_by_one)
    path = tmp_path / "broken.json"
    status, out = _run_in_process(monkeypatch, capsys, "--ops", "greedy_verify,kv_rollback", "--json", str(path))
    assert status == selftest.EXIT_FAILED == 1
    assert "FAIL greedy_verify [triton]" in out.out and "output_tokens: 1 entries differ" in out.out
    result = json.loads(path.read_text())
    # every case but those where id + 1 mod V is the same id (V = 1)
    greedy = result["matrix"]["greedy_verify"]["triton"]
    assert greedy["fail"] >= 6 and greedy["fail"] + greedy["pass"] == len(tiny_cases("greedy_verify"))
    assert not result["summary"]["ok"]
    assert result["matrix"]["kv_rollback"]["torch"]["pass"] == 1  # the run went on, the other op unaffected


def test_attention_off_by_more_than_the_tolerance_is_a_failure(monkeypatch, capsys):
    def drifted(q, k_cache, v_cache, seq_lens, parents=None, block_table=None, *, sm_scale=None):
        out, lse = reference.tree_attention(q, k_cache, v_cache, seq_lens, parents, block_table, sm_scale=sm_scale)
        return out + 1e-3, lse  # 10x the float32 tolerance

    _break(monkeypatch, "tree_attention", drifted)
    status, out = _run_in_process(monkeypatch, capsys, "--ops", "tree_attention")
    assert status == 1 and "FAIL tree_attention [triton]" in out.out and "values off by more than" in out.out


def test_a_wrong_sampled_token_is_not_excused_as_a_boundary_case(monkeypatch, capsys):
    def resampled(target_logits, draft_logits, draft_tokens, **kwargs):
        tokens, accepted = reference.rejection_sample_logits(target_logits, draft_logits, draft_tokens, **kwargs)
        tokens = tokens.clone()
        row = torch.arange(tokens.shape[0])
        tokens[row, accepted] = (tokens[row, accepted] + 7) % target_logits.shape[-1]  # every row's final draw
        return tokens, accepted

    _break(monkeypatch, "rejection_sample_logits", resampled)
    status, out = _run_in_process(monkeypatch, capsys, "--ops", "rejection_sample_logits")
    assert status == 1 and out.out.count("FAIL rejection_sample_logits [triton]") >= 6  # V = 1 / B = 0 cannot tell


def _wrong_first_row(fn, index=0, delta=1):
    """fn's outputs with output `index`'s first entry moved by `delta` (ids stay in range)."""
    def broken(*args, **kwargs):
        outputs = list(fn(*args, **kwargs))
        wrong = outputs[index].clone()
        wrong.view(-1)[0] += delta
        outputs[index] = wrong
        return tuple(outputs)
    return broken


@pytest.mark.parametrize("op,broken", [
    ("bild_verify", _wrong_first_row(reference.bild_verify, index=1)),
    ("tree_greedy_verify", _wrong_first_row(reference.tree_greedy_verify, index=2, delta=-1)),
    ("tree_rejection_sample", _wrong_first_row(reference.tree_rejection_sample, index=1)),
    ("early_exit_topk", _wrong_first_row(reference.early_exit_topk, index=0, delta=1e-2)),
    ("max_prob", lambda logits: reference.max_prob(logits) * (1 + 1e-4)),
    ("kv_compact", lambda k, v, seq_lens, accepted: reference.kv_compact(k, v, seq_lens, accepted) + 1),
], ids=lambda x: x if isinstance(x, str) else "")
def test_other_broken_backends_fail(monkeypatch, capsys, op, broken):
    _break(monkeypatch, op, broken)
    status, out = _run_in_process(monkeypatch, capsys, "--ops", op)
    assert status == 1 and f"FAIL {op} [triton]" in out.out and f"{op}  " in out.out


def test_an_exception_is_a_failure_and_the_run_goes_on(monkeypatch, capsys, tmp_path):
    def crash(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    _break(monkeypatch, "kv_compact", crash)
    path = tmp_path / "crash.json"
    status, out = _run_in_process(monkeypatch, capsys, "--ops", "kv_compact,kv_rollback", "--json", str(path))
    assert status == 1 and "RuntimeError: kernel exploded" in out.out
    matrix = json.loads(path.read_text())["matrix"]
    assert matrix["kv_compact"]["triton"]["fail"] == len(tiny_cases("kv_compact"))
    assert matrix["kv_rollback"]["torch"] == {"pass": 1, "fail": 0, "skip": 0}


def test_usage_errors(capsys):
    assert cli.main(["selftest", "--device", "cpu", "--ops", "nonsense"]) == 2
    assert "unknown nonsense" in capsys.readouterr().err
    assert cli.main(["selftest", "--device", "cpu", "--backends", "torch"]) == 2
    assert "torch is the reference" in capsys.readouterr().err
    assert cli.main(["selftest", "--device", "tpu"]) == 2
    assert cli.main(["selftest", "--device", "cpu", "--json", "/no/such/folder/out.json"]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_a_lost_cuda_context_stops_the_remaining_checks(monkeypatch, capsys, tmp_path):
    """After an error that poisons the context every later GPU call would fail too: the failing check and
    where it happened are reported, the rest is listed as not run (simulated: the context probe says lost)."""
    def fault(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    _break(monkeypatch, "greedy_verify", fault)
    monkeypatch.setattr(runner, "context_alive", lambda device: False)
    path = tmp_path / "lost.json"
    status, out = _run_in_process(monkeypatch, capsys, "--ops", "greedy_verify,kv_rollback", "--json", str(path))
    assert status == 1 and "illegal memory access" in out.out and "poisoned the context" in out.out
    matrix = json.loads(path.read_text())["matrix"]
    assert matrix["greedy_verify"]["triton"] == {"pass": 0, "fail": 1, "skip": len(tiny_cases("greedy_verify")) - 1}
    assert matrix["kv_rollback"]["torch"] == {"pass": 0, "fail": 0, "skip": 1}
