"""BiLD (Kim et al.): the small model runs while it is confident; the large model checks the run and rolls back.

    python python/generate_bild.py [--models PATH | --target PATH --draft PATH]
                                   [--fallback-threshold P] [--rollback-threshold NATS]

Fallback: the small model hands over once its top probability drops below `fallback_threshold` (or after
`max_small_run` tokens). Rollback: the large model scores the run in one pass and cuts it at the first token
with -log p_large > `rollback_threshold` (the paper's rule: lossy, faster) or at the first token that is not
its argmax (rollback_rule="exact": token-identical to greedy). Both are run; each says if it equals greedy.
"""

import specdec_kernels
from example_models import encode, greedy, load, parser, show

options = parser(__doc__)
options.add_argument("--fallback-threshold", type=float, default=0.6)
options.add_argument("--rollback-threshold", type=float, default=5.0)
args = options.parse_args()

models = load(args)
batch = encode(models.tokenizer)
reference = greedy(models, batch, args.max_new_tokens)
for rule in ("exact", "nll"):
    out = specdec_kernels.generate(models.target, batch["input_ids"], attention_mask=batch["attention_mask"],
                                   strategy="bild", draft_model=models.draft, rollback_rule=rule,
                                   fallback_threshold=args.fallback_threshold,
                                   rollback_threshold=args.rollback_threshold, max_small_run=10,
                                   max_new_tokens=args.max_new_tokens, pad_token_id=models.tokenizer.pad_token_id)
    print(f"bild ({rule}): fallback rate {out.stats.extra['fallback_rate']:.2f}, "
          f"rollback rate {out.stats.extra['rollback_rate']:.2f}")
    show(f"bild ({rule})", models, batch, out, reference)
