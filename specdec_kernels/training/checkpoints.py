"""Periodic checkpoints and resume for the training loops: `output_dir/checkpoint-<step>/` holds the
model (save_pretrained) and `trainer_state.pt` (step, optimizer, schedule and RNG states), so a
resumed run continues exactly where the saved one was."""

import re
import shutil
from pathlib import Path

import torch

STATE = "trainer_state.pt"


def latest_checkpoint(output_dir) -> Path | None:
    """The checkpoint with the highest step under output_dir, or None."""
    if output_dir is None or not Path(output_dir).is_dir():
        return None
    found = [(int(m.group(1)), p) for p in Path(output_dir).iterdir()
             if (m := re.fullmatch(r"checkpoint-(\d+)", p.name)) and (p / STATE).is_file()]
    return max(found)[1] if found else None


def save_checkpoint(output_dir, step: int, model, state: dict, keep: int) -> Path:
    """Write checkpoint-<step> (model + state incl. step), then keep only the newest `keep`."""
    path = Path(output_dir) / f"checkpoint-{step}"
    model.save_pretrained(path)
    torch.save({**state, "step": step}, path / STATE)
    older = sorted((int(p.name.split("-")[1]), p) for p in Path(output_dir).glob("checkpoint-*") if p != path)
    for _, stale in older[:max(len(older) - (keep - 1), 0)]:
        shutil.rmtree(stale, ignore_errors=True)
    return path


def load_state(checkpoint: Path) -> dict:
    return torch.load(Path(checkpoint) / STATE, weights_only=False)


def rng_state(generator: torch.Generator) -> dict:
    return {"torch": torch.get_rng_state(), "sampler": generator.get_state()}


def set_rng_state(state: dict, generator: torch.Generator) -> None:
    torch.set_rng_state(state["torch"])
    generator.set_state(state["sampler"])


def inverse_sqrt_schedule(warmup_steps: int):
    """lr factor: linear warm-up to 1 over warmup_steps, then sqrt(warmup / step) (the paper's)."""
    warmup = max(int(warmup_steps), 1)

    def factor(step: int) -> float:
        step += 1
        return step / warmup if step < warmup else (warmup / step) ** 0.5
    return factor
