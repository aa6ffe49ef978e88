"""SpecDec (Xia et al.): a block-parallel drafter proposes a whole block in one forward, the target verifies it.

    python python/generate_specdec.py [--models PATH] [--block-size K] [--top-beta B] [--tau T]

`ops.relaxed_verify` accepts a draft while it is within the target's top `top_beta` tokens and within `tau`
nats of its top-1. top_beta=1 (any tau) or tau=0 (any beta) is exact greedy, the default here; the paper's
top_beta=3, tau=1.0 accepts more drafts and may drift from greedy (the last line says whether it did).
"""

import specdec_kernels
from example_models import encode, greedy, load, parser, show

options = parser(__doc__, user_models=False)
options.add_argument("--block-size", type=int, help="drafts per step (default: the drafter's block size)")
options.add_argument("--top-beta", type=int, default=1)
options.add_argument("--tau", type=float, default=0.0)
args = options.parse_args()

models = load(args)
batch = encode(models.tokenizer)
reference = greedy(models, batch, args.max_new_tokens)
out = specdec_kernels.generate(models.target, batch["input_ids"], attention_mask=batch["attention_mask"],
                               strategy="specdec", drafter=models.specdec_drafter, block_size=args.block_size,
                               top_beta=args.top_beta, tau=args.tau, max_new_tokens=args.max_new_tokens,
                               pad_token_id=models.tokenizer.pad_token_id)
print("acceptance per draft position:", [round(a, 2) for a in out.stats.per_position_acceptance])
show(f"specdec (top_beta={args.top_beta}, tau={args.tau})", models, batch, out, reference)
