"""Random-weight Qwen3 checkpoints with the real Qwen3 tokenizer (`uv run apps/make_model`, or `slime-make-model`).

The checkpoint writer is `slime_make_model.checkpoint`; the command line is `slime_make_model.cli`.
"""

from slime_make_model.checkpoint import (
    DEFAULT_TOKENIZER_DIR,
    DTYPES,
    PRESETS,
    Preset,
    count_parameters,
    make_model,
    parameter_shapes,
    preset_config,
    write_random_weights,
)

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
