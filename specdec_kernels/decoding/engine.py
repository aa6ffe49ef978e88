"""The decoding loop every drafter shares: the drafter proposes, the target verifies in one forward on a
SpecCache, the engine's one Verifier accepts, the caches keep what it accepted, repeat.

Cache invariant (shapes stay static whatever each row accepted): the target cache holds every
committed token but the last one, the row's "root"; a step feeds [root, x_1..x_g] (g + 1 tokens)
and `cache.rollback(num_accepted)` keeps the root and the accepted drafts, so the emitted
correction/bonus token becomes the next root. Draft caches are the drafter's (see draft_model.py).

Rows are independent (per-row lengths, seeds, draw cursors; a finished row writes nothing more), and
the host reads one small tensor per step to decide whether to stop, drop finished rows (eager only)
and adapt the draft length. With CUDA graphs every tensor a captured step touches is made through
`keep` and every cache through `reuse`, so a later call with the same session_key replays the graphs.
"""

import contextlib
import time

import torch
from torch import Tensor

from .. import ops
from ..common import validate as check
from ..reference.tree import tree_depths
from . import graphs as graph_store
from .hidden_states import FINAL_NORM, TargetStates
from .output import GenerateOutput, Stats
from .standardize import Sampling
from .step import Accepted, Proposal, StepPlan
from .verifier import Rows, Verifier

OP = "generate"


def adapt_model(model, role: str):
    """specdec_kernels.hf.adapt with the error naming the role and what is supported."""
    from .. import hf
    try:
        return hf.adapt(model)
    except ValueError as error:
        raise ValueError(f"{OP}: the {role} model is not supported ({error})") from None


@contextlib.contextmanager
def restored_attention(*models):
    """hf.adapt switches a model's attention to `specdec_tree`; give users their models back as
    they passed them (so model.generate keeps working afterwards)."""
    saved = [(m, getattr(m.config, "_attn_implementation", None)) for m in models
             if hasattr(m, "set_attn_implementation")]
    try:
        yield
    finally:
        for model, implementation in saved:
            model.set_attn_implementation(implementation or "sdpa")


def eos_list(model, eos_token_id) -> list[int]:
    """eos_token_id (int, list, or None: the model's generation_config, as HF does)."""
    if eos_token_id is None:
        config = getattr(model, "generation_config", None)
        eos_token_id = getattr(config, "eos_token_id", None)
    if eos_token_id is None:
        return []
    return [int(e) for e in (eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id])]


def right_aligned(input_ids: Tensor, attention_mask: Tensor | None) -> tuple[Tensor, Tensor]:
    """Prompts (left- or right-padded, attention_mask 1 = token) as right-padded rows + lengths."""
    if attention_mask is None:
        return input_ids, torch.full((input_ids.shape[0],), input_ids.shape[1], dtype=torch.int64,
                                     device=input_ids.device)
    check.tensor(OP, "attention_mask", attention_mask, shape=tuple(input_ids.shape),
                 dtypes=(torch.int64, torch.int32, torch.bool, torch.float32), device=input_ids.device,
                 last_dim_contiguous=False)
    real = attention_mask != 0
    order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)  # tokens first, in order
    lengths = real.sum(dim=1)
    if input_ids.shape[0] and int(lengths.min()) == 0:
        check.fail(OP, "every row needs at least one prompt token (a row of attention_mask is all zeros)")
    return input_ids.gather(1, order), lengths.to(torch.int64)


SPAN_BUCKET = 64  # smallest length bucket; buckets double from there


def weight_addresses(module) -> tuple:
    """Where a module's parameters live: part of a graph key, since a graph replays these addresses
    (model.half().float() or a new state dict assigned by reference moves them; in-place loads do not)."""
    return tuple(p.data_ptr() for p in module.parameters())


def length_bucket(tokens: int) -> int:
    """The power of two (>= SPAN_BUCKET) holding `tokens`: at most 2x the memory, and every call in
    a bucket shares its graphs."""
    bucket = SPAN_BUCKET
    while bucket < tokens:
        bucket *= 2
    return bucket


def graphs_supported(device: torch.device, backend: str = "auto") -> bool:
    """CUDA graphs by default on a GPU, once ops.tree_attention has a GPU backend and the call does
    not name the torch one: the torch reference reads the rows' lengths back (a host sync), which
    graph capture forbids, and the caches run the attention on the call's backend."""
    return (device.type == "cuda" and backend != "torch"
            and any(b in ops.implemented_backends("tree_attention") for b in ("triton", "cuda")))


class Engine:
    """One `generate` call: target adapter and cache, the verifier, per-row state, the loop and its statistics."""

    def __init__(self, target, drafter, input_ids: Tensor, *, attention_mask=None, max_new_tokens: int,
                 sampling: Sampling, eos_token_id=None, pad_token_id=None, seed=None, backend="auto",
                 cuda_graphs=None, named: bool = False, on_step=None, min_new_tokens: int = 0):
        check.tensor(OP, "input_ids", input_ids, shape=("B", "P"), dtypes=check.INDEX_DTYPES, last_dim_contiguous=False)
        self.max_new_tokens = check.positive_int(OP, "max_new_tokens", max_new_tokens)
        if isinstance(min_new_tokens, bool) or not isinstance(min_new_tokens, int) or min_new_tokens < 0:
            check.fail(OP, f"`min_new_tokens` must be an int >= 0 (got {min_new_tokens!r})")
        self.min_new_tokens = min_new_tokens
        if backend not in ("auto", *ops.BACKENDS):  # before any model work: every op of a step runs on it
            check.fail(OP, f"backend must be one of 'auto', 'torch', 'triton', 'cuda' (got {backend!r})")
        self.target = adapt_model(target, "target")
        self.sampling, self.backend = sampling, backend
        self.device = self.target.lm_head.weight.device
        self.vocab = self.target.lm_head.weight.shape[0]
        self.encoder_decoder = hasattr(self.target, "encode")
        self.eos = eos_list(target, eos_token_id)
        if pad_token_id is None:
            pad_token_id = getattr(getattr(target, "generation_config", None), "pad_token_id", None)
        self.pad = int(pad_token_id if pad_token_id is not None else (self.eos[0] if self.eos else 0))
        self.eos_ids = torch.tensor(self.eos or [-1], dtype=torch.int64, device=self.device)
        if cuda_graphs is None:  # a drafter whose caches grow each step (dflash), or traversal's host loop: eager
            cuda_graphs = (graphs_supported(self.device, backend) and not getattr(drafter, "eager_only", False)
                           and (drafter.verification.capturable or not sampling.do_sample))
        cuda_graphs = bool(cuda_graphs)
        self.input_ids = input_ids.to(self.device)
        mask = None if attention_mask is None else attention_mask.to(self.device)
        if self.encoder_decoder:
            self.source_mask = mask
            start = getattr(target.config, "decoder_start_token_id", None)
            if start is None:
                check.fail(OP, "the encoder-decoder target has no config.decoder_start_token_id")
            batch = input_ids.shape[0]
            self.prompts = torch.full((batch, 1), int(start), dtype=torch.int64, device=self.device)
            self.prompt_lengths = torch.ones(batch, dtype=torch.int64, device=self.device)
        else:
            self.prompts, self.prompt_lengths = right_aligned(self.input_ids.to(torch.int64), mask)
        batch = self.prompts.shape[0]
        # room for every prompt token and every new one: exact when eager, bucketed when graphs are
        # kept, so calls of a similar length share them
        self.span = self.prompts.shape[1] + self.max_new_tokens
        if cuda_graphs:
            self.span = length_bucket(self.span)
        key = self.session_key(drafter, target, named) if cuda_graphs else None
        self.session = graph_store.session(key, drafter, cuda_graphs, self.device)
        self.graphs, self.drafter = self.session.runner, self.session.drafter
        self.session.state.setdefault("target.model", target)  # the graphs read its weights: hold it
        if seed is None:
            seed = int(torch.randint(0, 2**31 - 1, ()).item())
        rows = torch.arange(batch, dtype=torch.int64, device=self.device)
        self.seeds = self.keep("seeds", (int(seed) & 0xFFFFFFFF) | (rows << 32))  # one Philox key per request
        self.eos_ids = self.keep("eos_ids", self.eos_ids)
        eos_vocab = torch.zeros(self.vocab, dtype=torch.bool, device=self.device)  # EOS ids as a [V] mask
        eos_vocab[[e for e in self.eos if 0 <= e < self.vocab]] = True
        self.eos_vocab = self.keep("eos_vocab", eos_vocab)
        self.verifier = Verifier(self.drafter.verification, sampling, backend, self.eos_ids)
        self.row_ids = rows.clone()  # active row -> row of the output
        self._position_rows = {}
        self.on_step = on_step

    def session_key(self, drafter, target, named: bool):
        """What the captured graphs bake in besides kept tensors: the models, the drafter's
        configuration (its verification with it), shapes (batch, length bucket), sampling, backend, EOS
        and pad ids. None (nothing kept) for encoder-decoders, whose encoder states and cross-attention
        K/V are allocated per call, and for drafters without a graph_key. A drafter made from its
        strategy's name is matched by configuration; a drafter object only by itself."""
        drafter_key = drafter.graph_key()
        if self.encoder_decoder or drafter_key is None:
            return None
        owner = ("named",) if named else ("object", id(drafter))
        weight = self.target.lm_head.weight
        return (id(target), weight_addresses(target), owner, drafter_key, drafter.verification,
                self.prompts.shape[0], self.span,
                self.sampling, self.backend, tuple(self.eos), self.pad, weight.device, weight.dtype, self.min_new_tokens)

    def keep(self, name: str, value: Tensor) -> Tensor:
        """`value`, or, when the session kept a tensor under `name` (a kept graph reads and writes that
        one), that tensor filled with `value` in place."""
        kept = self.session.state.get(name)
        if kept is None:
            self.session.state[name] = value
            return value
        if kept.shape != value.shape or kept.dtype != value.dtype:
            raise RuntimeError(f"{OP}: kept tensor {name!r} is {tuple(kept.shape)} {kept.dtype}, the call needs "
                               f"{tuple(value.shape)} {value.dtype}: the session key misses a shape")
        return kept.copy_(value)

    def reuse(self, name: str, make):
        """(the object the session kept under `name`, True), else (make(), False); a kept cache is
        the caller's to reset."""
        state = self.session.state
        if name not in state:
            state[name] = make()
            return state[name], False
        return state[name], True

    # ---- setup -------------------------------------------------------------------------------

    def cache_length(self, adapter, role: str) -> int:
        """Room for the longest prompt, every new token and one step's drafts past the budget (the
        span's bucket when graphs are kept, within the model's positions)."""
        extra = self.drafter.max_width + 2
        length = self.prompts.shape[1] + self.max_new_tokens + extra
        limit = adapter.max_positions()
        if limit is not None and length > limit:
            check.fail(OP, f"the longest prompt ({self.prompts.shape[1]} tokens) + max_new_tokens "
                           f"({self.max_new_tokens}) + drafts ({extra}) = {length} "
                           f"positions exceeds the {role} model's {limit}: shorten the prompt or max_new_tokens")
        return min(self.span + extra, limit) if limit is not None else self.span + extra

    def new_cache(self, adapter, role: str, max_id: int | None = None, *, whole_prompt: bool = False):
        """A SpecCache for `adapter` holding every prompt token but the last (the root), on the
        call's backend (its attention, kv_compact and kv_rollback run there; a kept cache was made
        with it, as the session key holds the backend); encoder-decoders run their encoder first.
        max_id clamps the ids it is fed (a draft with a smaller embedding table). whole_prompt:
        every prompt token, and the logits at each row's last one are kept in
        self.prefill_logits [B, 1, V] (folds_first_step)."""
        cache, reused = self.reuse(f"{role}.cache",
                                   lambda: adapter.new_cache(self.prompts.shape[0], self.cache_length(adapter, role),
                                                             backend=self.backend))
        if reused:
            cache.reset()  # empty rows, same storage: the kept graphs address it
        fit = (lambda ids: ids) if max_id is None else (lambda ids: ids.clamp(max=max_id))
        if self.encoder_decoder:
            adapter.encode(fit(self.input_ids), cache, attention_mask=self.source_mask)
        lengths = self.prompt_lengths if whole_prompt else self.prompt_lengths - 1
        target = adapter is self.target  # its forward hands the drafter the prompt's hidden states
        writing = self.hidden.writing_prefill(lengths) if target else contextlib.nullcontext()
        norm_all = target and FINAL_NORM in self.hidden.layers
        with writing:
            if whole_prompt:
                self.prefill_logits = adapter.prefill(fit(self.prompts), cache, lengths, logits="last",
                                                      norm_all=norm_all)
            elif self.prompts.shape[1] > 1:
                adapter.prefill(fit(self.prompts[:, :-1]), cache, lengths, logits=False, norm_all=norm_all)
        return cache

    def folds_first_step(self) -> bool:
        """Whether the first token comes from the prefill, as in HF's generate: greedy decoding of a
        decoder-only target with a drafter that asks for it (plain). Otherwise a first step feeds
        the last prompt token again, one more target forward per call (on the CPU a one-token
        forward costs about what the prompt's does). Sampling keeps that step: it draws the first
        token like every later step draws its tokens."""
        return self.drafter.first_token_from_prefill and not self.encoder_decoder and not self.sampling.do_sample

    def setup(self) -> None:
        batch, width = self.prompts.shape[0], self.drafter.max_width + 1
        self.folded = self.folds_first_step()
        self.step = StepPlan(0)  # a folded first token is a step without drafts
        # the hooks go on before the prefill (the drafter reads the prompt's states) and before any
        # warm-up or capture of a verify step (their copies are part of the captured step)
        self.hidden = TargetStates(self, self.drafter.target_layers())
        self.cache = self.new_cache(self.target, "target", whole_prompt=self.folded)
        last = (self.prompt_lengths - 1).unsqueeze(1)
        keep, device = self.keep, self.device
        self.root = keep("root", self.prompts.gather(1, last).squeeze(1))
        self.prev = keep("prev", self.prompts.gather(1, (last - 1).clamp(min=0)).squeeze(1))  # token before the root
        # new tokens land here (up to max_new_tokens + one step's overshoot); the span bounds max_new_tokens
        self.generated = keep("generated", torch.full((batch, self.span + width), self.pad,
                                                      dtype=torch.int64, device=device))
        self.budget = keep("budget", torch.tensor(self.max_new_tokens, dtype=torch.int64, device=device))
        self.num_generated = keep("num_generated", torch.zeros(batch, dtype=torch.int64, device=device))
        self.finished = keep("finished", torch.zeros(batch, dtype=torch.bool, device=device))
        self.flags = keep("flags", torch.zeros(batch + 1, dtype=torch.bool, device=device))
        # each row's draw cursor: the first counter of its Philox draws in the next step (advance_cursor)
        self.cursor = keep("cursor", self.prompt_lengths.clone())
        # device-side counters, read once at the end
        self.counts = keep("counts", torch.zeros(3, dtype=torch.int64, device=device))  # forwards, emitted, accepted
        self.drafted_at = keep("drafted_at", torch.zeros(width - 1, dtype=torch.int64, device=device))
        self.accepted_at = keep("accepted_at", torch.zeros(width - 1, dtype=torch.int64, device=device))
        self.final = torch.full((batch, self.max_new_tokens), self.pad, dtype=torch.int64, device=self.device)
        self.final_lengths = torch.zeros(batch, dtype=torch.int64, device=self.device)
        self.drafter.start(self)
        if self.folded:  # the first token, as a step with zero drafts would have emitted it (greedy: no draws)
            no_drafts = Proposal(self.root.new_zeros(batch, 0))
            accepted = self.verifier(no_drafts, self.early_eos_banned(self.prefill_logits, None), self.rows())
            del self.prefill_logits
            self.record(accepted.tokens, accepted.num_accepted, None)

    # ---- one step ----------------------------------------------------------------------------

    def plan_step(self, first: bool) -> StepPlan:
        """The drafter's plan of the next step, kept as self.step (its width moves the draw cursor)."""
        self.step = self.drafter.plan(self, first)
        return self.step

    def rows(self) -> Rows:
        """What the verifier reads of the rows this step."""
        return Rows(self.root, self.seeds, self.cursor, self.step.depth)

    def verify_step(self, tokens: Tensor, probs: Tensor | None, num_draft: Tensor | None,
                    extra: Tensor | None, parents: Tensor | None) -> Tensor:
        """Target forward over [root, drafts], the verifier's verdict, the caches' commit (target KV, the
        hidden states the drafter reads, the drafter's own) and the row bookkeeping, all on the device;
        returns the flags the host reads."""
        proposal = Proposal(tokens, probs, num_draft, extra, parents)
        fed = self.root.unsqueeze(1) if tokens.shape[1] == 0 else torch.cat([self.root.unsqueeze(1), tokens], dim=1)
        with self.hidden.writing_step():
            logits = self.target.verify(fed, self.cache, parents)
        accepted = self.verifier(proposal, self.early_eos_banned(logits, parents), self.rows())
        if self.graphs.enabled:  # finished rows stay in the batch: their lengths must not move
            before = self.cache.seq_lens.clone()
            self.commit_target(proposal, accepted)
            self.cache.seq_lens.copy_(torch.where(self.finished, before, self.cache.seq_lens))
        else:  # eager: finished rows were dropped after the step that finished them, so every row is active
            self.commit_target(proposal, accepted)
        self.hidden.keep_accepted(accepted.nodes, accepted.num_accepted, self.finished)
        self.drafter.commit(self, proposal, accepted)
        self.advance_cursor()
        self.record(accepted.tokens, accepted.num_accepted, num_draft)
        return self.flags

    def commit_target(self, proposal: Proposal, accepted: Accepted) -> None:
        """The target cache keeps the root and what the step accepted: a tree's accepted nodes (compact),
        a chain's accepted prefix (rollback); a step without drafts keeps the one token it fed."""
        if proposal.tokens.shape[1] == 0:
            self.cache.commit(1)  # rollback(0) without the op call and its checks
        elif accepted.nodes is not None:
            self.cache.compact(accepted.nodes)
        else:
            self.cache.rollback(accepted.num_accepted)

    def advance_cursor(self) -> None:
        """Move every row's draw cursor past each counter this step could read (common/rng.py):
        its draws sit at cursor .. cursor + g for each purpose (a tree's levels stop at DEPTH <= g),
        so the next step starts at cursor + g + 1 whatever this one accepted. Keying steps by sequence
        position instead hands the next step draws that block verification already examined (it reads
        every coin and draft of its block), and the output leaves the target's law
        (tests/test_sampling_loops.py keeps that mutation)."""
        self.cursor.add_(self.step.width + 1)

    def early_eos_banned(self, logits: Tensor, parents: Tensor | None) -> Tensor:
        """min_new_tokens (HF's MinNewTokensLengthLogitsProcessor): the target's EOS logits are -inf
        where the token drawn from them would be new token number < min_new_tokens. logits [B, W, V]
        follow the fed tokens (a chain: W positions in order; a tree: node depths). Drafts stay as they
        are: one proposing EOS there meets p(EOS) = 0 and is rejected, so every drafter stays exact."""
        if self.min_new_tokens == 0 or not self.eos:
            return logits
        depth = self._positions(logits.shape[1]) if parents is None else tree_depths(parents)
        early = (self.num_generated.unsqueeze(1) + depth) < self.min_new_tokens  # [B, W]
        return logits.masked_fill(early.unsqueeze(-1) & self.eos_vocab, float("-inf"))

    def record(self, out: Tensor, num_accepted: Tensor, num_draft: Tensor | None) -> None:
        """Append each row's new tokens (cut at EOS and at max_new_tokens), update roots, flags, counts.
        num_draft [B] (ragged drafts) or None (every row drafted g). Without EOS ids, or without
        drafts (plain decoding: one token per row), the ops that would compute constants are skipped:
        on the CPU each op costs microseconds per token."""
        g = out.shape[1] - 1
        if g == 0 and not self.eos and not self.graphs.enabled:
            self._record_one(out)
            return
        j = self._positions(g + 1)
        active = ~self.finished
        emitted = num_accepted + 1
        keep = torch.minimum(emitted, self.budget - self.num_generated)
        if self.eos:
            is_eos = torch.isin(out, self.eos_ids) & (j < emitted.unsqueeze(1))
            first_eos = torch.where(is_eos.any(dim=1), is_eos.to(torch.int8).argmax(dim=1), g + 1)
            keep = torch.minimum(keep, first_eos + 1)
        keep = keep * active
        kept = j < keep.unsqueeze(1)
        self.generated.scatter_(1, self.num_generated.unsqueeze(1) + j, torch.where(kept, out, self.pad))
        done = self.num_generated + keep >= self.budget
        if self.eos:
            done |= (is_eos & kept).any(dim=1)
        self.num_generated.add_(keep)
        if g == 0:  # the history below, gathered at 1 and 2: the root becomes prev, the token the root
            self.prev.copy_(self.root)
            self.root.copy_(out[:, 0].clamp(min=0))
            self.counts[:2] += torch.stack([active.sum(), keep.sum()])
            all_accepted = torch.ones((), dtype=torch.bool, device=self.device)  # zero drafts, all accepted
        else:
            history = torch.cat([self.prev.unsqueeze(1), self.root.unsqueeze(1), out.clamp(min=0)], dim=1)
            self.prev.copy_(history.gather(1, (num_accepted + 1).unsqueeze(1)).squeeze(1))
            self.root.copy_(history.gather(1, (num_accepted + 2).unsqueeze(1)).squeeze(1))
            if num_draft is None:
                num_draft = torch.full_like(num_accepted, g)
            drafted = (j[:, :g] < num_draft.unsqueeze(1)) & active.unsqueeze(1)
            accepted = (j[:, :g] < num_accepted.unsqueeze(1)) & active.unsqueeze(1)
            self.drafted_at[:g] += drafted.sum(dim=0)
            self.accepted_at[:g] += accepted.sum(dim=0)
            self.counts += torch.stack([active.sum(), keep.sum(), accepted.sum()])
            all_accepted = ((num_accepted >= num_draft) | ~active).all()
        self.finished |= done
        self.flags.copy_(torch.cat([self.finished, all_accepted.unsqueeze(0)]))

    def _record_one(self, out: Tensor) -> None:
        """record() of one token per row (no drafts), no EOS ids, eager: every row is active (finished
        rows were dropped) and below its budget, so each keeps its one token; the general path's
        masks and minima are constants here, and a CPU step saves their ops."""
        token = out[:, :1]
        self.generated.scatter_(1, self.num_generated.unsqueeze(1), token)
        self.num_generated.add_(1)
        self.prev.copy_(self.root)
        self.root.copy_(token.squeeze(1).clamp(min=0))
        self.counts[:2] += out.shape[0]  # forwards and emitted tokens: one per row
        self.finished |= self.num_generated >= self.budget
        self.flags[:-1].copy_(self.finished)
        self.flags[-1] = True  # zero drafts: all accepted

    def _positions(self, width: int) -> Tensor:
        """[1, width] int64 0..width-1, made once per width on the CPU (a GPU step may be captured in a
        CUDA graph kept past this engine: it makes its own)."""
        if self.device.type != "cpu":
            return torch.arange(width, device=self.device).unsqueeze(0)
        positions = self._position_rows.get(width)
        if positions is None:
            positions = self._position_rows[width] = torch.arange(width, device=self.device).unsqueeze(0)
        return positions

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> GenerateOutput:
        session = self.session
        session.busy = True
        try:
            return self.loop()
        except BaseException:
            graph_store.discard(session)  # its graphs or kept state may be half made
            raise
        finally:
            session.busy = False
            if hasattr(self, "hidden"):  # setup made it: the target's modules lose this call's hooks
                self.hidden.close()

    def loop(self) -> GenerateOutput:
        self.captured_before = self.graphs.captured
        self.setup()
        stats = Stats()
        timer = StepTimer(self.device)
        first = True
        done = False
        if self.folded:  # setup emitted the first token: that was the first step
            stats.steps += 1
            if self.on_step is not None:
                self.observe_step(torch.zeros_like(self.num_generated))
            done = self.after_step(self.flags)
        while not done:
            before = self.num_generated.clone() if self.on_step is not None else None
            plan = self.plan_step(first)
            g = plan.width
            key = (self.root.shape[0], g)
            if self.graphs.enabled:
                self.trust_capacity()
            with timer.section("draft"):
                if first or g == 0:  # g == 0: an empty proposal, no kernel (torch warns at an empty graph)
                    proposal = self.drafter.propose(self, first)
                else:
                    proposal = self.graphs(("draft", *key), lambda: self.drafter.propose(self, False))
            with timer.section("verify"):
                inputs = (proposal.tokens, proposal.probs, proposal.num_draft, proposal.extra, proposal.parents)
                flags = (self.verify_step(*inputs) if first
                         else self.graphs(("verify", *key), self.verify_step, *inputs))
            first = False
            stats.steps += 1
            if before is not None:
                self.observe_step(before)
            done = self.after_step(flags)
        self.store_rows(torch.ones_like(self.finished))
        return self.output(stats, timer, self.drafter.finish(self))

    def after_step(self, flags: Tensor) -> bool:
        """Read the step's flags (its one host sync); True when every row is done. Eager mode drops
        the rows that finished."""
        host = flags.tolist()
        finished, all_accepted = host[:-1], host[-1]
        kept = None
        if not all(finished) and any(finished) and not self.graphs.enabled:
            kept = self.drop_rows(torch.tensor([not f for f in finished], device=self.device))
        self.drafter.end_step(self, all_accepted, kept)
        return all(finished)

    def observe_step(self, before: Tensor) -> None:
        """Hand the step's new tokens to `on_step(rows, tokens)` (rows: output row ids; tokens: each
        row's new ids, cut at EOS and the budget already) and apply what it returns: {row: n} keeps
        only the first n of that row's new tokens and finishes the row (a stop string ended there).
        One more host read per step, only when on_step is set."""
        start, end = before.tolist(), self.num_generated.tolist()
        active = [b for b in range(len(end)) if end[b] > start[b]]
        if not active:
            return
        rows = [int(r) for r in self.row_ids[active].tolist()]
        window = self.generated[active, :max(end)].tolist()  # one device read for every row, not one per row
        tokens = [row[start[b]:end[b]] for b, row in zip(active, window)]
        cuts = self.on_step(rows, tokens) or {}
        for b, row in zip(active, rows):
            if row not in cuts:
                continue
            keep = min(max(int(cuts[row]), 1), end[b] - start[b])
            self.generated[b, start[b] + keep:end[b]] = self.pad
            self.num_generated[b] = start[b] + keep
            self.counts[1] -= end[b] - start[b] - keep
            self.finished[b] = True
            self.flags[b] = True

    def trust_capacity(self) -> None:
        """Graph mode: the caches were sized for every token a row can write (cache_length) and
        finished rows are frozen, so the SpecCache's host-side overflow bound (which grows on every
        eager call and, near the end, reads the lengths back: a sync capture forbids) is reset."""
        for kept in self.session.state.values():  # the target's cache and the drafter's (engine.reuse)
            if hasattr(kept, "_length_bound"):
                kept._length_bound = 0

    def drop_rows(self, keep: Tensor) -> Tensor:
        """Eager mode: move finished rows' tokens to the output and drop them from the target's cache and
        the per-row state; returns the indices of the rows kept (the drafter drops its rows in end_step)."""
        self.store_rows(~keep)
        index = keep.nonzero().squeeze(1)
        self.cache.select_rows(index)
        self.hidden.select_rows(index)
        for name in ("root", "prev", "generated", "num_generated", "finished", "seeds", "cursor", "row_ids"):
            setattr(self, name, getattr(self, name).index_select(0, index))
        self.flags = self.flags.new_zeros(index.numel() + 1)
        return index

    def store_rows(self, rows: Tensor) -> None:
        ids = self.row_ids[rows]
        self.final[ids] = self.generated[rows, :self.max_new_tokens]
        self.final_lengths[ids] = self.num_generated[rows]

    def output(self, stats: Stats, timer: "StepTimer", extra: dict) -> GenerateOutput:
        longest = int(self.final_lengths.max()) if self.final_lengths.numel() else 0
        new = self.final[:, :longest]
        if self.encoder_decoder:
            sequences = torch.cat([self.prompts, new], dim=1)
        else:
            sequences = torch.cat([self.input_ids.to(torch.int64), new], dim=1)
        forwards, emitted, accepted = self.counts.tolist()
        stats.target_forwards, stats.emitted_tokens, stats.accepted_tokens = forwards, emitted, accepted
        drafted_at, accepted_at = self.drafted_at.tolist(), self.accepted_at.tolist()
        stats.drafted_tokens = sum(drafted_at)
        stats.per_position_acceptance = [a / d if d else 0.0 for a, d in zip(accepted_at, drafted_at)]
        stats.draft_time_s, stats.verify_time_s = timer.totals()
        # captured: by this call; kept: in the session, replayed by later calls of the same key
        stats.extra = dict(extra, cuda_graphs_captured=self.graphs.captured - self.captured_before,
                           cuda_graphs_kept=self.graphs.captured if self.session.stored else 0)
        return GenerateOutput(sequences, stats)


class StepTimer:
    """Time per section: CUDA events on a GPU (no sync until the end), perf_counter on the CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.spans = {"draft": [], "verify": []}

    @contextlib.contextmanager
    def section(self, name: str):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.spans[name].append((start, end))
        else:
            t0 = time.perf_counter()
            yield
            self.spans[name].append(time.perf_counter() - t0)

    def totals(self) -> tuple[float, float]:
        if self.cuda:
            torch.cuda.synchronize()
            return tuple(sum(s.elapsed_time(e) for s, e in self.spans[n]) / 1e3 for n in ("draft", "verify"))
        return sum(self.spans["draft"]), sum(self.spans["verify"])
