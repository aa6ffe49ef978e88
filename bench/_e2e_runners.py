"""The methods bench/e2e.py times, each as one callable per (pair, batch, mode), and the timing rule.

HF: `generate` plain (dynamic cache), `cache_implementation="static"` (HF compiles the forward on a
GPU; on the CPU it runs uncompiled), and assisted generation (`assistant_model=`, with the draft
length fixed at gamma like ours: constant schedule, no confidence threshold).
Ours: `specdec_kernels.generate(strategy="speculative")`, with the engine's CUDA graphs (its default
on a GPU) and eager; and "our plain greedy": the same engine, target adapter, SpecCache and CUDA
graphs with a draft of zero tokens (strategy "plain"), i.e. one target forward per token. That is
the baseline of Leviathan's formula: the same per-forward cost the speculative loop pays, minus drafting.
The cost ratio c is measured with the same plain loop run on the draft model: c = time per token of
plain decoding with the draft / the same with the target (batch size and graph mode matched).
"""

import signal
import statistics
import time
from contextlib import contextmanager

import torch

import specdec_kernels
from specdec_kernels import custom_generate


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


@contextmanager
def deadline(seconds: float | None):
    """Raise TimeoutError in this (main) thread after `seconds` (a compile that runs away is a result)."""
    if not seconds or not hasattr(signal, "SIGALRM"):
        yield
        return

    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds:.0f} s (--method-timeout)")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def time_calls(fn, device: torch.device, repeats: int, timeout: float | None) -> dict:
    """The first call timed on its own (compilation, graph capture, allocator warm-up), then the
    median of `repeats` further calls, each synchronised; the first of those is also reported alone
    (second_call_s: what a second request costs once graphs are kept). Returns {"first_call_s",
    "second_call_s" (None without repeats), "median_s", "out"}."""
    with deadline(timeout):
        sync(device)
        start = time.perf_counter()
        out = fn()
        sync(device)
        first = time.perf_counter() - start
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            out = fn()
            sync(device)
            times.append(time.perf_counter() - start)
    return {"first_call_s": first, "second_call_s": times[0] if times else None,
            "median_s": statistics.median(times) if times else first, "out": out}


def paired_ratio(base, other, device: torch.device, rounds: int) -> tuple[float, float, float]:
    """(median, min, max) over `rounds` of time(other) / time(base), the two called back to back in each
    round (alternating which goes first), so a noisy neighbour slows both calls of a round alike."""
    ratios = []
    for r in range(rounds):
        times = {}
        for name, fn in ((("base", base), ("other", other)) if r % 2 == 0 else (("other", other), ("base", base))):
            sync(device)
            start = time.perf_counter()
            fn()
            sync(device)
            times[name] = time.perf_counter() - start
        ratios.append(times["other"] / times["base"])
    return statistics.median(ratios), min(ratios), max(ratios)


def sampling_kwargs(do_sample: bool, hf: bool) -> dict:
    """Temperature 1 and no top-k/top-p filter, so every method samples one distribution (HF's
    top_k=0 switches its default of 50 off; ours has no default filter)."""
    if not do_sample:
        return dict(do_sample=False)
    return dict(do_sample=True, temperature=1.0, top_p=1.0, **({"top_k": 0} if hf else {}))


def hf_method(kind: str, target, draft, ids, max_new_tokens: int, do_sample: bool, gamma: int):
    """A zero-argument callable running HF generate ("hf_dynamic", "hf_static", "hf_assisted")."""
    kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=0, **sampling_kwargs(do_sample, hf=True))
    if kind == "hf_static":
        kwargs["cache_implementation"] = "static"
    elif kind == "hf_assisted":
        config = draft.generation_config
        config.num_assistant_tokens, config.num_assistant_tokens_schedule = gamma, "constant"
        config.assistant_confidence_threshold = 0.0
        kwargs["assistant_model"] = draft
    return lambda: target.generate(ids, **kwargs)


def ours_method(kind: str, target, draft, ids, max_new_tokens: int, do_sample: bool, gamma: int, graphs: bool,
                tree: tuple[int, int] | None = None):
    """A zero-argument callable running our engine: "ours_spec" (speculative; a token tree with
    tree=(tree_topk, tree_nodes)), "ours_hf_hook" (ours_spec behind HF's model.generate(custom_generate=))
    or "ours_plain" (greedy)."""
    options = dict(max_new_tokens=max_new_tokens, eos_token_id=[], pad_token_id=0,
                   cuda_graphs=None if graphs else False, **({"seed": 0} if do_sample else {}))  # greedy draws nothing
    if kind == "ours_plain":
        return lambda: specdec_kernels.generate(target, ids, strategy="plain", **options)
    if kind == "ours_hf_hook":  # the same call through HF's generate: HF's preparation + the translation
        del options["eos_token_id"]  # the pairs' configs have no EOS (no_eos), which HF reads
        return lambda: target.generate(ids, attention_mask=torch.ones_like(ids), custom_generate=custom_generate,
                                       assistant_model=draft, num_draft_tokens=gamma, return_dict_in_generate=True,
                                       **options, **sampling_kwargs(do_sample, hf=True))
    return lambda: specdec_kernels.generate(target, ids, strategy="speculative", draft_model=draft,
                                            num_draft_tokens=gamma, **options,
                                            **({} if tree is None else dict(tree_topk=tree[0], tree_nodes=tree[1])),
                                            **sampling_kwargs(do_sample, hf=False))


def leviathan_alpha(stats, gamma: int) -> float:
    """Leviathan's alpha (per-token acceptance probability), the Bernoulli estimate from a run:
    accepted drafts / drafts examined, where a step examines its accepted drafts plus the first rejected
    one (none when all gamma were accepted). vLLM's acceptance_rate (accepted / proposed) is lower
    whenever drafts after a rejection go unexamined."""
    accepted = stats.accepted_tokens
    full = stats.per_position_acceptance[gamma - 1] * stats.target_forwards if stats.per_position_acceptance else 0
    rejections = stats.target_forwards - full
    return accepted / max(accepted + rejections, 1e-9)


def leviathan_speedup(alpha: float, gamma: int, c: float) -> float:
    """Leviathan et al. Theorem 8: expected walltime improvement (1 - a^(g+1)) / ((1 - a)(g c + 1));
    at a = 1 its limit (g + 1) / (g c + 1)."""
    tokens = gamma + 1 if alpha >= 1 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens / (gamma * c + 1)
