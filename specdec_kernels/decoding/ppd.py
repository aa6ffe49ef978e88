"""Strategy `ppd` (Yang et al., "Predictive Pipelined Decoding"), its latency/compute theory
(Theorem 4.1) and a match-rate tool shaped like the paper's Table 2.

The paper runs k+1 processes on k+1 GPUs; on one GPU that layout gains nothing when decoding is
bandwidth bound, so this is a single-GPU form: each step runs the root through the lower layers,
takes the early head's top-k as candidates, and verifies them as k one-node branches of a tree in
one full forward (ops.early_exit_topk, ops.tree_attention; the verifier's greedy tree rule, one level
deep). The emitted tokens come only from final-layer logits, so the output is greedy's token for token.

Statistics: stats.per_position_acceptance[0] is the measured match rate p̂ (hits per step);
stats.extra carries exit_layer, k, head and the theory at that p̂.
"""

import copy

import torch
from torch import Tensor

from ..common import validate as check
from .drafter import Drafter
from .engine import OP, Engine, weight_addresses
from .step import Proposal, StepPlan

HEAD_KINDS = ("N", "Y")


def head_options(heads, target) -> dict:
    """PPD's options with a set of trained heads (EarlyExitHeads) for `target`: the heads, at the trained
    exit layer nearest d // 2 (none trained inside the target: the target's own head, "N")."""
    depth = target.config.num_hidden_layers
    layers = [layer for layer in heads.layers if 1 <= layer < depth]
    if not layers:
        return {"head": "N"}
    return {"head": heads, "exit_layer": min(layers, key=lambda layer: abs(layer - depth // 2))}


class PPDDecoder(Drafter):
    """`PPDDecoder(target, exit_layer=None, k=3, head=None).generate(input_ids, ...)`, or
    `specdec_kernels.generate(target, input_ids, strategy="ppd", k=3, ...)`.

    Args:
        exit_layer: d̄, the decoder layers before the early exit (1 <= d̄ < d; default d // 2).
        k: candidates per step (top-k of the early head).
        head: None / "N" (the model's final norm + LM head), an EarlyExitHead, or EarlyExitHeads
            (trained "Y" heads; the one for exit_layer is used).
        candidates: optional callable (engine, hidden [B, H]) -> int64 [B, k] replacing the head
            (oracles and adversaries for tests and for emulating match rates; output stays exact).
    """

    name = "ppd"

    def __init__(self, target=None, *, exit_layer: int | None = None, k: int = 3, head=None, candidates=None):
        self.target_model = target
        self.k = self.max_width = check.positive_int(OP, "k", k)
        self.exit_layer_option = None if exit_layer is None else check.positive_int(OP, "exit_layer", exit_layer)
        self.head_option, self.candidates = head, candidates
        if candidates is not None and not callable(candidates):
            check.fail(OP, "`candidates` must be callable (engine, hidden) -> [B, k] "
                           f"(got {type(candidates).__name__})")

    # ---- engine interface --------------------------------------------------------------------

    def start(self, engine: Engine) -> None:
        from ..models.early_exit_head import EarlyExitHead, EarlyExitHeads
        if engine.sampling.do_sample:
            check.fail(OP, "strategy 'ppd' is greedy (the paper's exact form); do_sample=True is not supported")
        if engine.encoder_decoder:
            check.fail(OP, "strategy 'ppd' supports decoder-only targets")
        depth = engine.target.num_layers
        self.depth = depth
        self.exit_layer = max(depth // 2, 1) if self.exit_layer_option is None else self.exit_layer_option
        if not 1 <= self.exit_layer < depth:
            check.fail(OP, f"`exit_layer` must be in [1, {depth - 1}] for a {depth}-layer target "
                           f"(got {self.exit_layer})")
        if self.k > engine.vocab:
            check.fail(OP, f"`k`={self.k} exceeds the vocabulary ({engine.vocab})")
        option = self.head_option
        if option is None or option == "N":
            head, self.head_kind = EarlyExitHead.from_model(engine.target), "N"
        elif isinstance(option, EarlyExitHeads):
            head, self.head_kind = option[self.exit_layer], "Y"
        elif isinstance(option, EarlyExitHead):
            head, self.head_kind = option, "Y"
        else:
            check.fail(OP, f"`head` must be None, 'N', an EarlyExitHead or EarlyExitHeads (got {option!r})")
        if head.weight.device != engine.device:
            check.fail(OP, f"the early-exit head is on {head.weight.device}, the target on {engine.device}")
        dtype = engine.target.lm_head.weight.dtype
        if head.weight.dtype != dtype:  # e.g. fp32-trained heads on a bf16 target: cast once, not per step
            # kept: a kept graph reads the cast copy's weights, which a new copy would free; refreshed
            # in place, as the head may have been trained further since
            cast, reused = engine.reuse("ppd.head", lambda: copy.deepcopy(head).to(dtype))
            if reused:
                with torch.no_grad():
                    for kept, source in zip(cast.parameters(), head.parameters()):
                        kept.copy_(source)
            head = cast
        self.head = head

    def graph_key(self):
        head = self.head_option
        if head not in (None, "N"):  # trained heads: the object and where its weights live
            head = (id(head), weight_addresses(head))
        return (self.name, self.k, self.exit_layer_option, head, id(self.candidates))

    def plan(self, engine: Engine, first: bool) -> StepPlan:
        return StepPlan(self.k, depth=1)  # k one-node branches: the verifier walks one level

    def propose(self, engine: Engine, first: bool) -> Proposal:
        # writes the root's lower-layer K/V, which the verify forward rewrites in place (same slot, same inputs)
        state = engine.target.forward_to_layer(engine.root.unsqueeze(1), engine.cache, self.exit_layer)
        hidden = state.hidden[:, 0]
        if self.candidates is not None:
            tokens = self.candidates(engine, hidden).to(torch.int64)
        else:
            _, tokens = self.head.topk(hidden, self.k, backend=engine.backend)
        # every candidate a child of the root: k branches of one node each
        batch, k = tokens.shape
        parents = torch.zeros(batch, k + 1, dtype=torch.int64, device=engine.device)
        parents[:, 0] = -1
        # one guessed position per step: stats.per_position_acceptance[0] is the match rate
        return Proposal(tokens, num_draft=torch.ones_like(engine.root), parents=parents)

    def finish(self, engine: Engine) -> dict:
        steps, hits = int(engine.drafted_at[0]), int(engine.accepted_at[0])
        rate = hits / steps if steps else 0.0
        out = {"exit_layer": self.exit_layer, "k": self.k, "head": self.head_kind, "match_rate": rate}
        if 2 * self.exit_layer >= self.depth:
            out["theory"] = theory(self.depth, self.exit_layer, self.k, rate)
        return out


# ---- theory ------------------------------------------------------------------------------------

def theory(d: int, d_bar: int, k: int, p_correct: float, length: int | None = None) -> dict:
    """PPD's latency/compute model in layer time units (Theorem 4.1, d/2 <= d̄ < d).

    Returns a dict:
      latency_per_token: d - (d - d̄)·p (ℓ → ∞); normalized_latency: that / d (Eq. 3 at d̄ = d/2);
      compute_per_token: latency + k(d - d̄) (compute units × time); normalized_compute_per_token:
      that / d (Eq. 6); compute_per_time_unit: compute / latency (Eq. 5);
      speedup: d / latency_per_token (the paper's k+1-GPU form, bounded by d / d̄);
      single_gpu_speedup: (1 + p)·d / (d + d̄), this package's one-GPU tree form when decoding is
      bandwidth bound (one half sweep + one full sweep per step, 1 + p tokens);
      with `length` ℓ: expected_latency dℓ - (d - d̄)(ℓ - 1)p and expected_compute
      expected_latency + k(d - d̄)ℓ, exactly as Theorem 4.1 states them.
    """
    op = "ppd.theory"
    d = check.positive_int(op, "d", d, minimum=2)
    d_bar = check.positive_int(op, "d_bar", d_bar)
    if not d <= 2 * d_bar < 2 * d:
        check.fail(op, f"Theorem 4.1 needs d/2 <= d_bar < d (got d={d}, d_bar={d_bar})")
    k = check.positive_int(op, "k", k)
    p = check.real_number(op, "p_correct", p_correct, minimum=0.0)
    if p > 1:
        check.fail(op, f"`p_correct` must be in [0, 1] (got {p})")
    saved = d - d_bar
    latency = d - saved * p
    compute = latency + k * saved
    out = {"latency_per_token": latency, "normalized_latency": latency / d, "compute_per_token": compute,
           "normalized_compute_per_token": compute / d, "compute_per_time_unit": compute / latency,
           "speedup": d / latency, "single_gpu_speedup": (1 + p) * d / (d + d_bar)}
    if length is not None:
        length = check.positive_int(op, "length", length)
        expected = d * length - saved * (length - 1) * p
        out.update(expected_latency=expected, expected_compute=expected + k * saved * length)
    return out


# ---- match rates -------------------------------------------------------------------------------

@torch.no_grad()
def match_rate(model, texts, layers, ks=(1, 3, 5), heads=None, *, tokenizer=None, new_tokens: int = 16,
               progress: bool = False) -> list[dict]:
    """The paper's p̂_correct along the greedy trajectory: for every generated token, is the
    final layer's top-1 among the early head's top-k at `layer`?

    Args:
        model: HF decoder-only model (fp32 recommended; not modified).
        texts: prompts, strings (with `tokenizer`) or token-id sequences; each is one prompt.
        layers: exit layers d̄ (HF output_hidden_states numbering, 1 <= d̄ < d).
        ks: candidate counts. heads: optional EarlyExitHeads ("Y" rows for the layers it holds).
        new_tokens: greedy tokens generated per prompt (the paper: 16 for SQuAD, 128 otherwise).

    Returns:
        rows {"layer", "k", "head" ("N"/"Y"), "match_rate", "tokens"}; format_match_table(rows)
        prints them like Table 2.
    """
    from ..models.early_exit_head import EarlyExitHead
    from tqdm.auto import tqdm
    depth = model.config.num_hidden_layers
    for layer in layers:
        if not 1 <= int(layer) < depth:
            check.fail("ppd.match_rate", f"layers must be in [1, {depth - 1}] (got {layer})")
    device = next(model.parameters()).device
    n_head = EarlyExitHead.from_model(model)
    kinds = [("N", lambda layer: n_head)]
    if heads is not None:
        kinds.append(("Y", lambda layer: heads[layer] if layer in heads else None))
    hits = {}
    total = 0
    for text in tqdm(list(texts), desc="match rate", disable=not progress):
        ids = (tokenizer(text, add_special_tokens=False)["input_ids"] if isinstance(text, str) else
               [int(t) for t in (text.tolist() if isinstance(text, Tensor) else text)])
        prompt = torch.tensor([ids], dtype=torch.int64, device=device)
        sequence = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                                  min_new_tokens=new_tokens, do_sample=False, num_beams=1, pad_token_id=0)
        out = model(sequence[:, :-1], output_hidden_states=True)
        first = prompt.shape[1] - 1  # the position whose output is the first generated token
        final = out.logits[0, first:].argmax(dim=-1)
        total += final.numel()
        for layer in layers:
            hidden = out.hidden_states[int(layer)][0, first:]
            for kind, pick in kinds:
                head = pick(int(layer))
                if head is None:
                    continue
                _, top = head.topk(hidden.contiguous(), max(ks), backend="torch")
                for k in ks:
                    key = (int(layer), k, kind)
                    hits[key] = hits.get(key, 0) + int((top[:, :k] == final.unsqueeze(1)).any(dim=1).sum())
    return [{"layer": layer, "k": k, "head": kind, "match_rate": count / total if total else 0.0, "tokens": total}
            for (layer, k, kind), count in sorted(hits.items(), key=lambda item: (item[0][1], item[0][2], item[0][0]))]


def format_match_table(rows: list[dict]) -> str:
    """Markdown table like the paper's Table 2: one line per (k, head), one column per layer."""
    layers = sorted({row["layer"] for row in rows})
    lines = ["| k | head | " + " | ".join(f"layer {layer}" for layer in layers) + " |",
             "|---|---|" + "---|" * len(layers)]
    for k, kind in sorted({(row["k"], row["head"]) for row in rows}):
        rates = {row["layer"]: row["match_rate"] for row in rows if row["k"] == k and row["head"] == kind}
        cells = [f"{100 * rates[layer]:.2f}%" if layer in rates else "-" for layer in layers]
        lines.append(f"| {k} | {kind} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
