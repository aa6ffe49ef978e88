"""A byte-level BPE tokenizer trained with the `tokenizers` library, wrapped for transformers.

Byte-level: every byte has a token, so any text round-trips exactly (the default models are
trained on source code, where whitespace matters). One special token, "<|endoftext|>", serves
as EOS and as padding.
"""

EOS = "<|endoftext|>"


def train_bpe_tokenizer(texts, vocab_size: int, *, progress: bool = False):
    """PreTrainedTokenizerFast with a byte-level BPE vocabulary of `vocab_size` learnt from `texts` (strings)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=progress)
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, pad_token=EOS)
