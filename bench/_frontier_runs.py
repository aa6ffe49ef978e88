"""Decoding every point of bench/lossy_frontier.py on every prompt, timed in interleaved rounds, and the
per-point measures: target forwards per token, tokens/s per round, and the quality of the outputs.

Rounds interleave at the prompt level (each prompt is decoded by every point, in an order rotated from
call to call, before the next prompt), so a change of the machine's load during a round hits every point
alike; a point's tokens/s in a round is its tokens over its seconds in that round, and its speed-up in
a round is that over the plain loop's in the same round.
"""

import statistics
import time
from dataclasses import dataclass, field

import torch

import specdec_kernels
from _quality import mean_nll, rouge_l_f1, token_nlls


@dataclass
class PointRun:
    seconds: list = field(default_factory=list)    # per round
    tokens: list = field(default_factory=list)     # per round
    outputs: list = field(default_factory=list)    # new tokens per prompt, first round
    forwards: int = 0                              # target forwards, first round
    drafted: int = 0                               # draft tokens proposed / accepted, first round
    accepted: int = 0
    extra: dict = field(default_factory=dict)      # strategy statistics summed over prompts, first round
    stable: bool = True                            # every later round gave the first round's tokens


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _models_for(strategy: str, models: dict) -> dict:
    if strategy in ("speculative", "bild"):
        return {"draft_model": models["draft"]}
    if strategy == "specdec":
        return {"drafter": models["drafter"]}
    return {}


def decode_all(points, prompts, models: dict, new_tokens: int, repeats: int, device, pad: int,
               progress=print) -> dict:
    """{point name: PointRun}. prompts: lists of ids; models: target, draft, drafter. EOS is ignored, so
    every output has new_tokens tokens and ROUGE-L compares sequences of one length."""
    runs = {p.name: PointRun(seconds=[0.0] * repeats, tokens=[0] * repeats) for p in points}
    ids = [torch.tensor([p], device=device) for p in prompts]
    common = dict(max_new_tokens=new_tokens, eos_token_id=[], pad_token_id=pad)
    for strategy in dict.fromkeys(p.strategy for p in points):  # one-time costs (first calls) timed nowhere
        point = next(p for p in points if p.strategy == strategy)
        specdec_kernels.generate(models["target"], ids[0], strategy=strategy, **_models_for(strategy, models),
                                 **point.options, **dict(common, max_new_tokens=min(4, new_tokens)))
    calls = 0
    for r in range(repeats):
        for i, prompt in enumerate(ids):
            shift = calls % len(points)
            for point in points[shift:] + points[:shift]:
                _sync(device)
                start = time.perf_counter()
                out = specdec_kernels.generate(models["target"], prompt, strategy=point.strategy,
                                               **_models_for(point.strategy, models), **point.options, **common)
                _sync(device)
                run = runs[point.name]
                run.seconds[r] += time.perf_counter() - start
                run.tokens[r] += out.stats.emitted_tokens
                new = out.sequences[0, prompt.shape[1]:].tolist()
                if r == 0:
                    run.outputs.append(new)
                    run.forwards += out.stats.target_forwards
                    run.drafted += out.stats.drafted_tokens
                    run.accepted += out.stats.accepted_tokens
                    for key, value in out.stats.extra.items():
                        if isinstance(value, (int, float)):
                            run.extra[key] = run.extra.get(key, 0) + value
                else:
                    run.stable &= new == run.outputs[i]
            calls += 1
        progress(f"round {r + 1}/{repeats} done")
    return runs


def _mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and the half-width of its normal 95% interval (0 for fewer than two values)."""
    mean = statistics.fmean(values)
    half = 1.96 * statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0
    return mean, half


def greedy_baseline(greedy: PointRun, examples, target) -> dict:
    """Per prompt, the quality of the target's own greedy output (the plain loop's): what every point's
    differences are taken against."""
    per_token = [token_nlls(target, e.prompt, g) for g, e in zip(greedy.outputs, examples)]
    return {"outputs": greedy.outputs, "token_nlls": per_token, "nll": [statistics.fmean(t) for t in per_token],
            "rouge_true": [rouge_l_f1(g, e.continuation) for g, e in zip(greedy.outputs, examples)],
            "true_nll": statistics.fmean(mean_nll(target, e.prompt, e.continuation) for e in examples)}


def point_row(point, run: PointRun, base: dict, plain: PointRun, examples, target) -> dict:
    """The measured row of one point: speed against the plain loop (same rounds), forwards per token,
    and quality against the target's greedy output (`base`, greedy_baseline's) and the true continuation."""
    emitted = sum(len(o) for o in run.outputs)
    rates = [t / s for t, s in zip(run.tokens, run.seconds)]
    plain_rates = [t / s for t, s in zip(plain.tokens, plain.seconds)]
    speedups = [a / b for a, b in zip(rates, plain_rates)]
    rouge_greedy = [rouge_l_f1(o, g) for o, g in zip(run.outputs, base["outputs"])]
    nll = [mean_nll(target, e.prompt, o) for o, e in zip(run.outputs, examples)]
    rouge_true = [rouge_l_f1(o, e.continuation) for o, e in zip(run.outputs, examples)]
    nll_delta, nll_ci = _mean_ci([a - b for a, b in zip(nll, base["nll"])])
    true_delta, true_ci = _mean_ci([a - b for a, b in zip(rouge_true, base["rouge_true"])])
    row = {"point": point.name, "family": point.family, "strategy": point.strategy, "lossless": point.lossless,
           **point.settings,
           "forwards_per_token": round(run.forwards / max(emitted, 1), 4),
           "tokens_per_forward": round(emitted / max(run.forwards, 1), 3),
           "acceptance_rate": round(run.accepted / run.drafted, 3) if run.drafted else None,
           "tokens_per_s": round(statistics.median(rates), 1),
           "tokens_per_s_spread": round((max(rates) - min(rates)) / statistics.median(rates), 3),
           "speedup": round(statistics.median(speedups), 3),
           "speedup_min": round(min(speedups), 3), "speedup_max": round(max(speedups), 3),
           "rouge_l_greedy": round(statistics.fmean(rouge_greedy), 4),
           "identical_to_greedy": round(sum(o == g for o, g in zip(run.outputs, base["outputs"])) / len(run.outputs), 3),
           "nll": round(statistics.fmean(nll), 4),
           "nll_minus_greedy": round(nll_delta, 4), "nll_minus_greedy_ci95": round(nll_ci, 4),
           "rouge_l_true": round(statistics.fmean(rouge_true), 4),
           "rouge_l_true_minus_greedy": round(true_delta, 4), "rouge_l_true_minus_greedy_ci95": round(true_ci, 4),
           "stable_outputs": run.stable,
           "tokens_per_s_rounds": [round(x, 1) for x in rates]}
    for key in ("fallback_rate", "rollback_rate"):
        if key in run.extra:
            row[key] = round(run.extra[key] / len(run.outputs), 3)  # mean over prompts of the per-call rate
    return row
