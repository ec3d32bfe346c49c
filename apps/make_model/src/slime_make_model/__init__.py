"""Random-weight Qwen3 and Qwen3-VL checkpoints with the real Qwen3 tokenizer.

Run as `uv run apps/make_model` or `slime-make-model`. The checkpoint writer is `slime_make_model.checkpoint`;
the command line is `slime_make_model.cli`.
"""

from typing import Any

from slime_make_model.presets import DEFAULT_TOKENIZER_DIR, PRESETS, Preset

# Names of the checkpoint writer, imported on first use: it needs torch and transformers, `--help` does not.
_LAZY = {"DTYPES", "count_parameters", "make_model", "parameter_shapes", "preset_config", "write_random_weights"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from slime_make_model import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'slime_make_model' has no attribute {name!r}")


__all__ = [
    "DEFAULT_TOKENIZER_DIR",
    "DTYPES",
    "PRESETS",
    "Preset",
    "count_parameters",
    "make_model",
    "parameter_shapes",
    "preset_config",
    "write_random_weights",
]
