"""Token trees vs the chain for strategy `speculative`, and the verification rules of each: tokens per
target forward and tokens/s over a grid of (DEPTH = num_draft_tokens, K = tree_topk, N = tree_nodes), on
the embedded default pair (or --models PATH) and every --pair TARGET DRAFT. Sampling runs each chain
with every --verifications rule (token-wise or block verification) and each tree with every --siblings
rule (top-K or sampled without replacement); greedy decoding does not depend on either.

Per (pair, mode, DEPTH, K, N): tokens_per_forward = emitted tokens / target forwards (summed over rows)
on --accept-prompts prompts in one call per --seeds seed (greedy: deterministic; sampling: seeded,
--temperatures, no filter), its ratio to the token-wise chain of the same depth (K = 1, N = DEPTH), and
tokens/s at each --batch-sizes,
median and min-max of --repeats calls per configuration, the configurations interleaved within each repeat
(so a noisy neighbour on a shared machine slows all of them alike). Greedy rows also say whether the
output equals the target's own greedy `generate`. EOS is off: every call emits batch x --max-new-tokens.

    python bench/speculative_trees.py --out bench/results                   # CPU: default pair
    python bench/speculative_trees.py --smoke --out /tmp/trees              # tiny grid (CI)
    python bench/speculative_trees.py --chains 2 4 6 --wide --seeds 8 ...   # chains only, + the wide pair

Sampling rows with several seeds also compare each rule with its partner on the same prompts and seeds
(block with token-wise on the chain, sampled with top siblings on the same tree): vs_partner is the mean
per-seed difference of tokens per forward and partner_ci95 its 95% half-width (Student t over the seeds);
tpf_ci95 is the same half-width for the row's own tokens per forward.
Writes speculative_trees_<device>.json and .md under --out (--stem renames them).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import specdec_kernels
from _e2e_pairs import WIDE_SHAPE, AlignedPair, Pair, default_pair, local_pair, random_prompts
from _report import write_report

COLS = ["pair", "mode", "depth", "tree_topk", "tree_nodes", "rule", "tokens_per_forward", "tpf_ci95", "vs_chain",
        "vs_partner", "partner_ci95", "matches_greedy"]
# two-sided 95% Student t quantiles by degrees of freedom (seeds - 1)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       11: 2.201, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
GRID = {2: [(1, 2), (2, 4), (3, 6), (3, 8), (4, 12)],
        3: [(1, 3), (2, 6), (3, 8), (3, 12), (4, 16), (2, 10)],
        4: [(1, 4), (2, 8), (3, 12), (4, 16), (2, 14)]}
SMOKE_GRID = {2: [(1, 2), (2, 4)]}


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", default=None, help="default model set folder (default: the embedded set)")
    parser.add_argument("--pair", nargs=2, action="append", default=[], metavar=("TARGET", "DRAFT"),
                        help="local HF model folders (repeatable)")
    parser.add_argument("--depths", type=int, nargs="+", default=None, help="DEPTH values (default: 2 3 4)")
    parser.add_argument("--chains", type=int, nargs="+", default=None,
                        help="chains only (no trees) at these DEPTH values, instead of --depths")
    parser.add_argument("--wide", action="store_true",
                        help="also the wide pair: a 6-layer x 384 random Llama (12.6 M) with a 1-layer draft sharing "
                             "its first layer (bench/_e2e_pairs.AlignedPair, --noise)")
    parser.add_argument("--noise", type=float, default=0.05, help="the wide pair's noise")
    parser.add_argument("--no-default", action="store_true", help="skip the embedded default pair")
    parser.add_argument("--modes", nargs="+", default=["greedy", "sampling"], choices=["greedy", "sampling"])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0], help="sampling temperatures")
    parser.add_argument("--accept-prompts", type=int, default=16, help="prompts of the tokens-per-forward call")
    parser.add_argument("--seeds", type=int, default=1, help="sampling: tokens-per-forward calls (seeds 0..n-1)")
    parser.add_argument("--verifications", nargs="+", default=["token", "block"], choices=["token", "block"],
                        help="sampling: chain verification rules")
    parser.add_argument("--siblings", nargs="+", default=["top"], choices=["top", "sampled"],
                        help="sampling: tree sibling rules")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4], help="batches timed for tokens/s")
    parser.add_argument("--prompt-length", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--smoke", action="store_true", help="DEPTH 2, two configurations, few tokens (CI)")
    parser.add_argument("--out", default="bench/results")
    parser.add_argument("--stem", default=None, help="output file names (default: speculative_trees_<device>)")
    args = parser.parse_args(argv)
    grid = SMOKE_GRID if args.smoke else GRID
    if args.smoke:
        args.accept_prompts, args.batch_sizes, args.max_new_tokens, args.repeats, args.seeds = 2, [1], 6, 1, 1
    depths = args.depths or sorted(grid)
    args.grid = [(d, k, n) for d in depths for k, n in grid.get(d, [(1, d), (2, 2 * d)])]
    if args.chains:
        args.grid = [(d, 1, d) for d in args.chains]
    args.stem = args.stem or f"speculative_trees_{torch.device(args.device).type}"
    return args


def call(pair, ids, depth: int, k: int, n: int, rule: str, args, temperature: float | None, seed: int = 0):
    """One generate call; temperature None is greedy. `rule`: the chain's verification or the tree's siblings."""
    chain = (k, n) == (1, depth)
    options = dict(verification=rule) if chain else dict(tree_siblings=rule)
    return specdec_kernels.generate(pair.target, ids, strategy="speculative", draft_model=pair.draft,
                                    num_draft_tokens=depth, tree_topk=k, tree_nodes=n, **options,
                                    max_new_tokens=args.max_new_tokens, eos_token_id=[], pad_token_id=0,
                                    **({} if temperature is None else dict(seed=seed)),  # greedy draws nothing
                                    do_sample=temperature is not None, temperature=temperature or 1.0,
                                    cuda_graphs=False)


PARTNERS = {"block": "token", "sampled": "top"}  # each rule's baseline on the same prompts and seeds


def ci95(values: list[float]) -> float | None:
    """95% half-width of the mean of `values` (Student t), None for fewer than two."""
    if len(values) < 2:
        return None
    t = T95.get(len(values) - 1, T95[max(k for k in T95 if k <= len(values) - 1)])
    return round(t * statistics.stdev(values) / len(values) ** 0.5, 4)


def configurations(args, sampling: bool) -> list[tuple]:
    """(depth, K, N, rule): greedy runs one rule per shape (it decides nothing there)."""
    configs = []
    for depth, k, n in args.grid:
        rules = args.verifications if (k, n) == (1, depth) else args.siblings
        configs += [(depth, k, n, rule) for rule in (rules if sampling else rules[:1])]
    return configs


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def run_pair(pair, args, device) -> list[dict]:
    if pair.skip:
        return [{"pair": pair.name, "status": "skipped", "error": pair.skip}]
    rows = []
    accept_ids = pair.prompts[:args.accept_prompts].to(device)
    modes = [(mode, None) for mode in args.modes if mode == "greedy"]
    modes += [(f"sampling T={t}", t) for t in args.temperatures if "sampling" in args.modes]
    for mode, sampling in modes:
        greedy = None if sampling is not None else pair.target.generate(accept_ids, max_new_tokens=args.max_new_tokens,
                                                            do_sample=False, pad_token_id=0)
        by_config, chain = {}, {}
        per_seed = {}
        for depth, k, n, rule in configurations(args, sampling is not None):
            emitted = forwards = 0
            per_seed[(depth, k, n, rule)] = []
            for seed in range(args.seeds if sampling is not None else 1):
                out = call(pair, accept_ids, depth, k, n, rule, args, sampling, seed)
                emitted, forwards = emitted + out.stats.emitted_tokens, forwards + out.stats.target_forwards
                per_seed[(depth, k, n, rule)].append(out.stats.emitted_tokens / out.stats.target_forwards)
            row = {"pair": pair.name, "mode": mode, "depth": depth, "tree_topk": k, "tree_nodes": n,
                   "rule": rule if sampling is not None else "", "tokens_per_forward": round(emitted / forwards, 3),
                   "tpf_ci95": ci95(per_seed[(depth, k, n, rule)])}
            if greedy is not None:
                row["matches_greedy"] = bool(torch.equal(out.sequences, greedy))
            if (k, n) == (1, depth) and rule in ("token", args.verifications[0]) and depth not in chain:
                chain[depth] = row["tokens_per_forward"]
            by_config[(depth, k, n, rule)] = row
            rows.append(row)
        for key, row in by_config.items():
            if row["depth"] in chain:
                row["vs_chain"] = round(row["tokens_per_forward"] / chain[row["depth"]], 3)
            partner = PARTNERS.get(key[3])
            if sampling is not None and (*key[:3], partner) in per_seed:
                diffs = [a - b for a, b in zip(per_seed[key], per_seed[(*key[:3], partner)])]
                row["vs_partner"] = round(statistics.fmean(diffs), 4)
                row["partner_ci95"] = ci95(diffs)
        for batch in args.batch_sizes:
            ids = pair.prompts[:batch].to(device)
            times = {key: [] for key in by_config}
            for key in by_config:  # warm-up: first-call costs are not what this measures
                call(pair, ids, *key, args, sampling)
            for _ in range(args.repeats):
                for key in by_config:  # interleaved
                    sync(device)
                    start = time.perf_counter()
                    call(pair, ids, *key, args, sampling)
                    sync(device)
                    times[key].append(time.perf_counter() - start)
            for key, row in by_config.items():
                rates = [batch * args.max_new_tokens / t for t in times[key]]
                row[f"tok_s_b{batch}"] = round(statistics.median(rates), 1)
                row[f"tok_s_b{batch}_range"] = f"{min(rates):.1f}-{max(rates):.1f}"
        for row in by_config.values():
            print({k: v for k, v in row.items() if k != "pair"}, flush=True)
    return rows


def best_trees(rows: list[dict]) -> list[dict]:
    """Per (pair, mode, depth): the best tree with N <= 16 by tokens per target forward, vs the
    token-wise chain."""
    best = {}
    for row in rows:
        if row.get("tree_topk", 1) > 1 and row.get("tree_nodes", 99) <= 16 and "vs_chain" in row:
            key = (row["pair"], row["mode"], row["depth"])
            if key not in best or row["vs_chain"] > best[key]["vs_chain"]:
                best[key] = row
    return [{"pair": p, "mode": m, "depth": d, "tree_topk": r["tree_topk"], "tree_nodes": r["tree_nodes"],
             "rule": r["rule"], "vs_chain": r["vs_chain"]} for (p, m, d), r in sorted(best.items())]


def block_gains(rows: list[dict]) -> list[dict]:
    """Per (pair, mode, depth): block verification's tokens per forward over the token-wise chain's."""
    chains = {(r["pair"], r["mode"], r["depth"], r["rule"]): r for r in rows
              if r.get("tree_topk") == 1 and r.get("tree_nodes") == r.get("depth") and r.get("rule")}
    return [{"pair": p, "mode": m, "depth": d, "token": r["tokens_per_forward"],
             "block": chains[(p, m, d, "block")]["tokens_per_forward"], "vs_chain": chains[(p, m, d, "block")]["vs_chain"]}
            for (p, m, d, rule), r in sorted(chains.items()) if rule == "token" and (p, m, d, "block") in chains]


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    pairs = [] if args.no_default else [default_pair(args.models, max(args.accept_prompts, *args.batch_sizes),
                                                     args.prompt_length, device, dtype)]
    pairs += [local_pair(t, d, max(args.accept_prompts, *args.batch_sizes), args.prompt_length, device, dtype)
              for t, d in args.pair]
    if args.wide:
        family = AlignedPair(WIDE_SHAPE, 1, 6, device, dtype)
        family.set_noise(args.noise)
        prompts = random_prompts(WIDE_SHAPE["vocab_size"], max(args.accept_prompts, *args.batch_sizes), args.prompt_length)
        pairs.append(Pair("wide", family.target, family.draft, prompts, noise=args.noise, info=family.describe()))
    rows = []
    for pair in pairs:
        rows += run_pair(pair, args, device)
    cols = COLS + [c for b in args.batch_sizes for c in (f"tok_s_b{b}", f"tok_s_b{b}_range")]
    command = "python " + " ".join(["bench/speculative_trees.py", *(sys.argv[1:] if argv is None else argv)])
    best, gains = best_trees(rows), block_gains(rows)
    note = (f"{'bf16' if dtype == torch.bfloat16 else 'fp32'}, {args.threads} thread(s), prompts of "
            f"{args.prompt_length} tokens, {args.max_new_tokens} new tokens per row (EOS off). tokens_per_forward: "
            f"{args.accept_prompts} prompts x {args.seeds} seed(s); vs_chain: over the token-wise chain (K=1, N=DEPTH) "
            f"at the same depth; tok_s: "
            f"median (and min-max) of {args.repeats} interleaved calls per batch size. Best tree (N <= 16) per "
            "depth: " + "; ".join(
                f"{b['mode']} D={b['depth']}: K={b['tree_topk']} N={b['tree_nodes']} {b['rule']} {b['vs_chain']}x"
                for b in best) + ". Block verification over token-wise (chain): " + "; ".join(
                f"{b['mode']} D={b['depth']}: {b['token']} -> {b['block']} ({b['vs_chain']}x)" for b in gains))
    write_report(rows, Path(args.out), args.stem, "Token trees vs chain (speculative)", cols, command,
                 {"best_trees": best, "block_gains": gains, "grid": args.grid, "threads": args.threads, "seeds": args.seeds}, note)


if __name__ == "__main__":
    main()
