"""Token trees vs the chain for strategy `speculative` (issue 19): tokens per target forward and tokens/s
over a grid of (DEPTH = num_draft_tokens, K = tree_topk, N = tree_nodes), on the embedded default pair
(or --models PATH) and every --pair TARGET DRAFT.

Per (pair, mode, DEPTH, K, N): tokens_per_forward = emitted tokens / target forwards (summed over rows)
on --accept-prompts prompts in one call (greedy: deterministic; sampling: seeded, --temperatures, no
filter), its ratio to the chain of the same depth (K = 1, N = DEPTH), and tokens/s at each --batch-sizes,
median and min-max of --repeats calls per configuration, the configurations interleaved within each repeat
(so a noisy neighbour on a shared machine slows all of them alike). Greedy rows also say whether the
output equals the target's own greedy `generate`. EOS is off: every call emits batch x --max-new-tokens.

    python bench/speculative_trees.py --out bench/results                   # CPU: default pair
    python bench/speculative_trees.py --smoke --out /tmp/trees              # tiny grid (CI)
Writes speculative_trees_<device>.json and .md under --out (--stem renames them).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

import specdec_kernels
from _e2e_pairs import default_pair, local_pair
from _report import write_report

COLS = ["pair", "mode", "depth", "tree_topk", "tree_nodes", "tokens_per_forward", "vs_chain", "matches_greedy"]
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
    parser.add_argument("--modes", nargs="+", default=["greedy", "sampling"], choices=["greedy", "sampling"])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0], help="sampling temperatures")
    parser.add_argument("--accept-prompts", type=int, default=16, help="prompts of the tokens-per-forward call")
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
        args.accept_prompts, args.batch_sizes, args.max_new_tokens, args.repeats = 2, [1], 6, 1
    depths = args.depths or sorted(grid)
    args.grid = [(d, k, n) for d in depths for k, n in grid.get(d, [(1, d), (2, 2 * d)])]
    args.stem = args.stem or f"speculative_trees_{torch.device(args.device).type}"
    return args


def call(pair, ids, depth: int, k: int, n: int, args, temperature: float | None):
    """One generate call; temperature None is greedy."""
    return specdec_kernels.generate(pair.target, ids, strategy="speculative", draft_model=pair.draft,
                                    num_draft_tokens=depth, tree_topk=k, tree_nodes=n,
                                    max_new_tokens=args.max_new_tokens, eos_token_id=[], pad_token_id=0, seed=0,
                                    do_sample=temperature is not None, temperature=temperature or 1.0,
                                    cuda_graphs=False)


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
        for depth, k, n in args.grid:
            out = call(pair, accept_ids, depth, k, n, args, sampling)
            stats = out.stats
            row = {"pair": pair.name, "mode": mode, "depth": depth, "tree_topk": k, "tree_nodes": n,
                   "tokens_per_forward": round(stats.emitted_tokens / stats.target_forwards, 3)}
            if greedy is not None:
                row["matches_greedy"] = bool(torch.equal(out.sequences, greedy))
            if (k, n) == (1, depth):
                chain[depth] = row["tokens_per_forward"]
            by_config[(depth, k, n)] = row
            rows.append(row)
        for row in by_config.values():
            if row["depth"] in chain:
                row["vs_chain"] = round(row["tokens_per_forward"] / chain[row["depth"]], 3)
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
    """Per (pair, mode, depth): the best tree with N <= 16 by tokens per target forward, vs the chain."""
    best = {}
    for row in rows:
        if row.get("tree_topk", 1) > 1 and row.get("tree_nodes", 99) <= 16 and "vs_chain" in row:
            key = (row["pair"], row["mode"], row["depth"])
            if key not in best or row["vs_chain"] > best[key]["vs_chain"]:
                best[key] = row
    return [{"pair": p, "mode": m, "depth": d, "tree_topk": r["tree_topk"], "tree_nodes": r["tree_nodes"],
             "vs_chain": r["vs_chain"]} for (p, m, d), r in sorted(best.items())]


def main(argv=None):
    args = parse_args(argv)
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    pairs = [default_pair(args.models, max(args.accept_prompts, *args.batch_sizes), args.prompt_length, device, dtype)]
    pairs += [local_pair(t, d, max(args.accept_prompts, *args.batch_sizes), args.prompt_length, device, dtype)
              for t, d in args.pair]
    rows = []
    for pair in pairs:
        rows += run_pair(pair, args, device)
    cols = COLS + [c for b in args.batch_sizes for c in (f"tok_s_b{b}", f"tok_s_b{b}_range")]
    command = "python " + " ".join(["bench/speculative_trees.py", *(sys.argv[1:] if argv is None else argv)])
    best = best_trees(rows)
    note = (f"{'bf16' if dtype == torch.bfloat16 else 'fp32'}, {args.threads} thread(s), prompts of "
            f"{args.prompt_length} tokens, {args.max_new_tokens} new tokens per row (EOS off). tokens_per_forward: "
            f"{args.accept_prompts} prompts in one call; vs_chain: over K=1, N=DEPTH at the same depth; tok_s: "
            f"median (and min-max) of {args.repeats} interleaved calls per batch size. Best tree (N <= 16) per "
            "depth, issue 19's target >= 1.15x: " + "; ".join(
                f"{b['mode']} D={b['depth']}: K={b['tree_topk']} N={b['tree_nodes']} {b['vs_chain']}x" for b in best))
    write_report(rows, Path(args.out), args.stem, "Token trees vs chain (speculative)", cols, command,
                 {"best_trees": best, "grid": args.grid, "threads": args.threads}, note)


if __name__ == "__main__":
    main()
