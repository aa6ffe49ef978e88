"""Output quality as the BiLD and SpecDec papers measure it, adapted to token sequences: ROUGE-L F1
(longest common subsequence) against a reference, and the target model's mean per-token NLL of a text.

ROUGE-L is written out here (a few lines) rather than taken from a package: the bench needs it on token
ids, and the package gains no runtime dependency for a benchmark.
"""

import torch


def lcs_length(a, b) -> int:
    """Length of the longest common subsequence of two sequences (dynamic programming, O(len(a) len(b)),
    one row kept)."""
    if len(a) < len(b):
        a, b = b, a
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l_f1(candidate, reference) -> float:
    """ROUGE-L F1 = 2 P R / (P + R) with P = LCS / len(candidate), R = LCS / len(reference) (Lin 2004 with
    beta = 1, as the rouge-score package computes it); 0.0 when either side is empty or nothing is shared."""
    candidate, reference = list(candidate), list(reference)
    if not candidate or not reference:
        return 0.0
    common = lcs_length(candidate, reference)
    if common == 0:
        return 0.0
    precision, recall = common / len(candidate), common / len(reference)
    return 2 * precision * recall / (precision + recall)


@torch.no_grad()
def token_nlls(model, prompt: list[int], text: list[int]) -> list[float]:
    """The model's -log p(token | everything before it) for each token of `text`, which follows `prompt`
    (nats). One forward over prompt + text."""
    if not prompt or not text:  # the first text token's probability needs at least one token before it
        raise ValueError("token_nlls: needs a non-empty prompt and text")
    device = next(model.parameters()).device
    ids = torch.tensor([list(prompt) + list(text)], device=device)
    logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return torch.nn.functional.cross_entropy(logits, ids[0, len(prompt):], reduction="none").tolist()


def mean_nll(model, prompt: list[int], text: list[int]) -> float:
    """The model's mean per-token NLL of `text` after `prompt` (nats per token; lower = the model likes
    the text more)."""
    nlls = token_nlls(model, prompt, text)
    return sum(nlls) / len(nlls)
