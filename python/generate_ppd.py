"""PPD (Yang et al.): guess the next token from an early-exit head, verify k guesses as k tree branches.

    python python/generate_ppd.py [--models PATH | --target PATH] [--exit-layer L] [--k K] [--head N|Y]

Each step runs the last token up to layer `exit_layer`, takes the top `k` of an early-exit head there
(`ops.early_exit_topk`; head "N" = the model's own final norm + LM head, "Y" = the set's trained heads) and
verifies the k guesses in one forward; a hit emits two tokens. Only the final layer decides, so the output is
greedy's (lossless).
"""

import specdec_kernels
from example_models import encode, greedy, load, parser, show

options = parser(__doc__, draft=False)
options.add_argument("--exit-layer", type=int, help="layers before the early exit (default: a trained head's layer "
                                                    "near the middle, or depth // 2)")
options.add_argument("--k", type=int, default=3)
options.add_argument("--head", choices=("N", "Y"), help="default: Y with a default set, N with --target")
args = options.parse_args()

models = load(args)
heads = getattr(models, "early_exit_heads", None)
head = args.head or ("Y" if heads is not None else "N")
if head == "Y" and heads is None:
    raise SystemExit("--head Y needs a default set's trained heads (use --head N with --target)")
exit_layer = args.exit_layer
if head == "Y" and exit_layer is None:  # the trained head nearest the middle of the target
    exit_layer = min(heads.layers, key=lambda layer: abs(layer - models.target.config.num_hidden_layers // 2))
batch = encode(models.tokenizer)
reference = greedy(models, batch, args.max_new_tokens)
out = specdec_kernels.generate(models.target, batch["input_ids"], attention_mask=batch["attention_mask"],
                               strategy="ppd", exit_layer=exit_layer, k=args.k, head=heads if head == "Y" else "N",
                               max_new_tokens=args.max_new_tokens, pad_token_id=models.tokenizer.pad_token_id)
print(f"ppd: exit layer {out.stats.extra['exit_layer']}, k {args.k}, head {head}, "
      f"match rate {out.stats.extra['match_rate']:.2f}")
show(f"ppd (head {head})", models, batch, out, reference)
