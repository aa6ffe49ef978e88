"""`custom_generate`: specdec_kernels.generate behind HF's own `model.generate` (`specdec_kernels.custom_generate`).

    out = target.generate(**batch, custom_generate=custom_generate, assistant_model=draft, max_new_tokens=64)

One adapter in four files: hook.py translates HF's call into `specdec_kernels.generate`'s arguments,
assisted.py maps HF's assisted-generation settings, settings.py classifies every HF generation setting
(docs/hf.md prints it), and hf_private.py is the only code that reads transformers' private surface.
"""

from .hook import custom_generate

# the upstream this adapter tracks (the custom_generate contract of GenerationMixin.generate; tested 5.17 to 5.24)
TRACKS = "transformers 5.x"

__all__ = ["custom_generate"]
