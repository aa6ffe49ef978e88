"""The only code that reads transformers' private surface; each function is small and says what it
falls back to when a transformers release changes that surface."""

import sys

# HF's own defaults of the assisted-generation settings, used where a transformers release cannot say
HF_DEFAULTS = {"num_assistant_tokens": 20, "num_assistant_tokens_schedule": "constant",
               "assistant_confidence_threshold": 0.4, "assistant_lookbehind": 10, "target_lookbehind": 10}


def calling_generate():
    """What custom_generate reads from the HF generate() that called it (two frames up): its
    assistant_model, streamer and **kwargs (the keywords the user passed that are not generate()'s own
    parameters), which HF does not pass a callable; None if not found."""
    frame = sys._getframe(2)
    try:
        for _ in range(4):
            if frame is None:
                return None
            local = frame.f_locals
            if (frame.f_code.co_name == "generate" and "custom_generate" in local and "assistant_model" in local
                    and "streamer" in local):
                return {"assistant_model": local["assistant_model"], "streamer": local["streamer"],
                        "kwargs": dict(local.get("kwargs") or {})}
            frame = frame.f_back
        return None
    finally:
        del frame


def assisted_defaults() -> dict:
    """HF's defaults of the assisted-generation settings (GenerationConfig._get_default_generation_params
    where the release has it, else HF_DEFAULTS)."""
    from transformers import GenerationConfig

    read = getattr(GenerationConfig, "_get_default_generation_params", None)
    return {**HF_DEFAULTS, **{k: v for k, v in (read() if read else {}).items() if k in HF_DEFAULTS}}
