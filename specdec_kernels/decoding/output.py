"""What `generate` returns: the sequences (HF's layout) and the run's statistics."""

from dataclasses import dataclass, field

import torch


@dataclass
class Stats:
    """Counts over all rows of one `generate` call.

    steps: engine iterations (one target forward each, for the whole batch).
    target_forwards: per-row target forwards, summed over rows (a row counts while it is unfinished).
    drafted_tokens / accepted_tokens: draft tokens proposed to / accepted by the target.
    emitted_tokens: tokens appended to the outputs (accepted drafts + corrections/bonus, after EOS
        and max_new_tokens cut).
    mean_accepted_tokens: emitted_tokens / target_forwards (Spec-Bench's tokens per target forward).
    acceptance_rate: accepted_tokens / drafted_tokens (vLLM's draft acceptance rate).
    per_position_acceptance: [g_max] accepted / drafted at each draft position.
    draft_time_s / verify_time_s: time in the draft step and in the verify step.
    extra: strategy-specific numbers (BiLD: fallback and rollback rates).
    """

    steps: int = 0
    target_forwards: int = 0
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    emitted_tokens: int = 0
    per_position_acceptance: list = field(default_factory=list)
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def mean_accepted_tokens(self) -> float:
        return self.emitted_tokens / max(self.target_forwards, 1)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / max(self.drafted_tokens, 1)

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if k != "extra"}
        out.update(mean_accepted_tokens=self.mean_accepted_tokens, acceptance_rate=self.acceptance_rate, **self.extra)
        return out


@dataclass
class GenerateOutput:
    """sequences: int64 [B, P + T] like HF's generate: the prompts as passed (left padding kept),
    then the new tokens, pad_token_id after a row's EOS and after its last token (T = the longest
    row's new tokens). Encoder-decoder models: [B, 1 + T], decoder start token first."""

    sequences: torch.Tensor
    stats: Stats
