"""Every HF generation setting and what `custom_generate` does with it: mapped onto the engine, refused with a
one-line error, or ignored on purpose (it cannot change the tokens). docs/hf.md prints this table; a test
checks that it covers every public field of transformers' GenerationConfig and that the page lists each one.

Refusals come in two kinds: settings HF turns into a logits processor or a stopping criterion are refused
where that processor arrives (`_sampling`, `_stopping` in hook.py, naming the processor); settings that
reach the hook only as a field of the generation config are checked here (`refuse`), naming the setting.
"""

MAPPED, REFUSED, IGNORED = "mapped", "refused", "ignored on purpose"
PROCESSOR = "its logits processor is refused"

# name -> (kind, what happens); CHECKED below holds the neutral values of the settings refused here
SETTINGS = {
    # lengths and stopping
    "max_length": (MAPPED, "max_new_tokens = max_length - the prompt's width (HF's MaxLengthCriteria)"),
    "max_new_tokens": (MAPPED, "max_new_tokens"),
    "min_length": (MAPPED, "min_new_tokens = min_length - the prompt's width (EOS banned before it)"),
    "min_new_tokens": (MAPPED, "min_new_tokens (EOS banned in the target's distribution before it)"),
    "eos_token_id": (MAPPED, "eos_token_id (HF's EosTokenCriteria)"),
    "pad_token_id": (MAPPED, "pad_token_id"),
    "max_time": (MAPPED, "checked after every accepted token (HF's MaxTimeCriteria)"),
    "stop_strings": (REFUSED, "transformers drops tokenizer= for a callable, so the hook refuses stop_strings= "
                              "and names what works: StoppingCriteriaList([StopStringCriteria(tokenizer, stops)]), "
                              "checked after every accepted token"),
    "forced_eos_token_id": (MAPPED, "the token at max_length - 1 becomes EOS (BART), exact"),
    "decoder_start_token_id": (MAPPED, "encoder-decoders: must be the model's config.decoder_start_token_id "
                                       "(another one is refused)"),
    # sampling
    "do_sample": (MAPPED, "do_sample"),
    "temperature": (MAPPED, "temperature (target and draft alike)"),
    "top_k": (MAPPED, "top_k (HF's default 50 when sampling, as HF applies it)"),
    "top_p": (MAPPED, "top_p"),
    "min_p": (MAPPED, "min_p"),
    # output
    "return_dict_in_generate": (MAPPED, "HF's output class, with our statistics as .stats"),
    # assisted generation
    "num_assistant_tokens": (MAPPED, "the draft length: speculative num_draft_tokens, bild max_small_run, specdec "
                                     "block_size; refused for other strategies (see the table below)"),
    "num_assistant_tokens_schedule": (MAPPED, "'heuristic' / 'heuristic_transient': speculative schedule='heuristic' "
                                              "(see the table below); refused for other strategies"),
    "prompt_lookup_num_tokens": (MAPPED, "strategy 'lookup', num_draft_tokens (the first match, as HF)"),
    "max_matching_ngram_size": (MAPPED, "lookup max_ngram (2 when unset, as HF)"),
    "assistant_confidence_threshold": (REFUSED, "HF's confidence stop for the assistant, re-fitted online; none of "
                                                "our strategies drafts that way (bild's fallback_threshold is "
                                                "related but lossy)"),
    "assistant_early_exit": (REFUSED, "self-speculation from an early exit; strategy 'ppd' is our early-exit form"),
    "assistant_ensemble_weight": (REFUSED, "HF's lossy ensemble verification"),
    "assistant_lookbehind": (REFUSED, "assistants with another tokenizer are not supported"),
    "target_lookbehind": (REFUSED, "assistants with another tokenizer are not supported"),
    "speculation_type": (MAPPED, "'dflash': strategy 'dflash', the DFlash assistant (muse_glimmer_assistant) "
                                 "passed as assistant_model drafts (any batch size)"),
    "use_mtp": (MAPPED, "strategy 'mtp': the target's own multi-token-prediction layers draft (any batch size)"),
    # decoding modes the engine does not run
    "num_beams": (REFUSED, "beam search"),
    "num_beam_groups": (REFUSED, "group beam search"),
    "diversity_penalty": (REFUSED, "group beam search"),
    "penalty_alpha": (REFUSED, "contrastive search"),
    "dola_layers": (REFUSED, "DoLa decoding"),
    "constraints": (REFUSED, "constrained beam search"),
    "force_words_ids": (REFUSED, "constrained beam search"),
    "num_return_sequences": (REFUSED, "one sequence per prompt"),
    "token_healing": (REFUSED, "HF refuses it itself without tokenizer=, which transformers drops for a callable"),
    "output_scores": (REFUSED, "per-step scores are not produced"),
    "output_logits": (REFUSED, "per-step logits are not produced"),
    "output_attentions": (REFUSED, "attentions are not produced"),
    "output_hidden_states": (REFUSED, "hidden states are not produced"),
    # logits processors
    "repetition_penalty": (REFUSED, PROCESSOR),
    "encoder_repetition_penalty": (REFUSED, PROCESSOR),
    "no_repeat_ngram_size": (REFUSED, PROCESSOR),
    "encoder_no_repeat_ngram_size": (REFUSED, PROCESSOR),
    "bad_words_ids": (REFUSED, PROCESSOR),
    "sequence_bias": (REFUSED, PROCESSOR),
    "suppress_tokens": (REFUSED, PROCESSOR),
    "begin_suppress_tokens": (REFUSED, PROCESSOR),
    "forced_bos_token_id": (REFUSED, PROCESSOR),
    "exponential_decay_length_penalty": (REFUSED, PROCESSOR),
    "guidance_scale": (REFUSED, PROCESSOR),
    "typical_p": (REFUSED, PROCESSOR),
    "epsilon_cutoff": (REFUSED, PROCESSOR),
    "eta_cutoff": (REFUSED, PROCESSOR),
    "top_h": (REFUSED, PROCESSOR),
    "renormalize_logits": (REFUSED, PROCESSOR),
    "remove_invalid_values": (REFUSED, PROCESSOR),
    "watermarking_config": (REFUSED, PROCESSOR),
    # what cannot change the tokens
    "length_penalty": (IGNORED, "beam search only (refused), as in HF's greedy and sampling"),
    "early_stopping": (IGNORED, "beam search only (refused), as in HF's greedy and sampling"),
    "low_memory": (IGNORED, "beam and contrastive search only (both refused)"),
    "use_cache": (IGNORED, "the engine always decodes on its own KV cache"),
    "cache_implementation": (IGNORED, "the engine's SpecCache replaces HF's caches (paged never reaches the hook)"),
    "cache_config": (IGNORED, "the engine's SpecCache replaces HF's caches"),
    "max_cache_len": (IGNORED, "the engine sizes its cache from the prompt and max_new_tokens"),
    "prefill_chunk_size": (IGNORED, "the engine prefills each prompt in one forward"),
    "compile_config": (IGNORED, "the engine captures CUDA graphs of its own"),
    "disable_compile": (IGNORED, "the engine captures CUDA graphs of its own (cuda_graphs=False turns them off)"),
    "continuous_batching_config": (IGNORED, "continuous batching never reaches a custom_generate"),
    "bos_token_id": (IGNORED, "HF uses it only to make a prompt when none is given; the prompt reaches us"),
    "is_assistant": (IGNORED, "HF's internal flag for its assistant's own generate calls"),
    "transformers_version": (IGNORED, "metadata"),
}

# settings refused here, by their neutral values (None always counts as unset)
CHECKED = {
    "num_beams": (1,), "num_beam_groups": (1,), "diversity_penalty": (0.0,), "penalty_alpha": (0.0,),
    "dola_layers": (), "constraints": (), "force_words_ids": (), "num_return_sequences": (1,),
    "output_scores": (False,), "output_logits": (False,), "output_attentions": (False,),
    "output_hidden_states": (False,),
    "assistant_early_exit": (), "assistant_ensemble_weight": (),
}


def refuse(config, fail) -> None:
    """fail(one line) for the first setting of `config` refused here that is not at its neutral value."""
    for name, neutral in CHECKED.items():
        value = getattr(config, name, None)
        if value is not None and value not in neutral:
            fail(f"{name}={value!r} is not supported ({SETTINGS[name][1]})")
