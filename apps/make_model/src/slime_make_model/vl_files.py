"""The non-weight files of a Qwen3-VL checkpoint: config, image/video processor configs, chat template, tokenizer.

Everything is written as plain JSON in the layout of the published ``Qwen/Qwen3-VL-*-Instruct`` repositories
(``config.json`` with ``rope_scaling`` + ``rope_theta``, ``preprocessor_config.json``,
``video_preprocessor_config.json``, ``chat_template.jinja``), not through ``save_pretrained``: the directory is then
read the same way by every transformers 5.x, whichever version wrote it (the GPU machine's trainer has 5.17, its
SGLang 5.12.1, and a newer ``save_pretrained`` adds fields such as a vision ``rope_parameters`` that an older one
does not know). ``AutoProcessor.from_pretrained`` loads the result offline.

No torch here; the weights are `slime_make_model.checkpoint`'s.
"""

import importlib.metadata
import json
import shutil
from pathlib import Path
from typing import Any

from slime_make_model.presets import QWEN3_BOS_ID, QWEN3_EOS_ID, QWEN3_VOCAB_SIZE, TOKENIZER_FILES, Preset

__all__ = [
    "IMAGE_PROCESSOR",
    "QWEN_VL_TOKEN_IDS",
    "VIDEO_PROCESSOR",
    "VL_CHAT_TEMPLATE",
    "vl_config_dict",
    "write_vl_files",
]

#: Qwen-VL special tokens of the Qwen3 vocabulary (`<|image_pad|>`, `<|video_pad|>`, `<|vision_start|>`,
#: `<|vision_end|>`), as the published Qwen3-VL configs name them.
QWEN_VL_TOKEN_IDS = {
    "image_token_id": 151655,
    "video_token_id": 151656,
    "vision_start_token_id": 151652,
    "vision_end_token_id": 151653,
}
#: Qwen3-VL's rotary settings: theta 5e6, 3-D (temporal, height, width) sections of the 64 rotary frequencies of a
#: 128-wide head, interleaved.
ROPE_THETA = 5_000_000
MROPE_SECTION = (24, 20, 20)

#: A Qwen-VL chat template: string contents, or part lists where each image part (`{"type": "image"}`, or any part
#: with an `image`/`image_url` key) becomes `<|vision_start|><|image_pad|><|vision_end|>` (what the processor
#: expands to one `<|image_pad|>` per merged patch), each video part the same with `<|video_pad|>`, text parts
#: their text. The published Qwen3-VL template renders these prompts to the same string; its tool-call and
#: reasoning branches are left out.
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' or 'image' in part or 'image_url' in part %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'video' or 'video' in part %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in part %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

#: `preprocessor_config.json` of the published Qwen3-VL models: 16-pixel patches, 2x2 merge, images resized to
#: between 256x256 (65536) and 4096x4096 pixels in multiples of 32, normalized with mean = std = 0.5.
IMAGE_PROCESSOR: dict[str, Any] = {
    "image_processor_type": "Qwen2VLImageProcessorFast",
    "processor_class": "Qwen3VLProcessor",
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "merge_size": 2,
    "patch_size": 16,
    "resample": 3,
    "rescale_factor": 1 / 255,
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "temporal_patch_size": 2,
}
#: `video_preprocessor_config.json` of the published Qwen3-VL models (loaded with the processor; no video is sent).
VIDEO_PROCESSOR: dict[str, Any] = {
    "video_processor_type": "Qwen3VLVideoProcessor",
    "processor_class": "Qwen3VLProcessor",
    "do_convert_rgb": True,
    "do_normalize": True,
    "do_rescale": True,
    "do_resize": True,
    "do_sample_frames": True,
    "fps": 2,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "max_frames": 768,
    "merge_size": 2,
    "min_frames": 4,
    "patch_size": 16,
    "resample": 3,
    "rescale_factor": 1 / 255,
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "temporal_patch_size": 2,
}


def vl_config_dict(preset: Preset, dtype: str, vocab_size: int = QWEN3_VOCAB_SIZE) -> dict[str, Any]:
    """`config.json` of a Qwen3-VL preset, in the published checkpoints' layout.

    Args:
        preset: a preset with `vision` (its fields are the text config, `vision` the vision config).
        dtype: checkpoint dtype name (`bfloat16`, ...), recorded at both levels (SGLang reads the text config's).
        vocab_size: embedding rows.

    Raises:
        ValueError: the preset has no vision tower, or its vision settings disagree with the processor files
            (patch, merge and temporal sizes are written to both).
    """
    vision = preset.vision
    if vision is None:
        raise ValueError("vl_config_dict: the preset has no vision tower")
    processor = (IMAGE_PROCESSOR["patch_size"], IMAGE_PROCESSOR["merge_size"], IMAGE_PROCESSOR["temporal_patch_size"])
    if (vision.patch_size, vision.spatial_merge_size, vision.temporal_patch_size) != processor:
        raise ValueError(f"vision patch/merge/temporal sizes must be {processor} (the processor files' values)")
    if 2 * sum(MROPE_SECTION) != preset.head_dim:
        raise ValueError(f"head_dim {preset.head_dim}: the 3-D rotary sections {MROPE_SECTION} cover head_dim 128")
    text = {
        "model_type": "qwen3_vl_text",
        "vocab_size": vocab_size,
        "hidden_size": preset.hidden_size,
        "intermediate_size": preset.intermediate_size,
        "num_hidden_layers": preset.num_hidden_layers,
        "num_attention_heads": preset.num_attention_heads,
        "num_key_value_heads": preset.num_key_value_heads,
        "head_dim": preset.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": preset.max_position_embeddings,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-6,
        "rope_scaling": {"rope_type": "default", "mrope_section": list(MROPE_SECTION), "mrope_interleaved": True},
        "rope_theta": ROPE_THETA,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": preset.tie_word_embeddings,
        "use_cache": True,
        "bos_token_id": QWEN3_BOS_ID,
        "eos_token_id": QWEN3_EOS_ID,
        "dtype": dtype,
    }
    vision_config = {
        "model_type": "qwen3_vl_vision",
        "depth": vision.depth,
        "hidden_size": vision.hidden_size,
        "num_heads": vision.num_heads,
        "intermediate_size": vision.intermediate_size,
        "hidden_act": "gelu_pytorch_tanh",
        "in_channels": 3,
        "patch_size": vision.patch_size,
        "temporal_patch_size": vision.temporal_patch_size,
        "spatial_merge_size": vision.spatial_merge_size,
        "out_hidden_size": preset.hidden_size,
        "num_position_embeddings": vision.num_position_embeddings,
        "deepstack_visual_indexes": list(vision.deepstack_visual_indexes),
        "initializer_range": 0.02,
    }
    return {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "text_config": text,
        "vision_config": vision_config,
        "tie_word_embeddings": preset.tie_word_embeddings,
        "dtype": dtype,
        **QWEN_VL_TOKEN_IDS,
        # Without a version, transformers' tokenizer loader suspects a Mistral regex bug and warns on every load.
        "transformers_version": importlib.metadata.version("transformers"),
    }


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def write_vl_files(out_dir: Path, preset: Preset, tokenizer_dir: Path, dtype: str) -> None:
    """Writes config, processor configs, chat template and the Qwen3 tokenizer (with `VL_CHAT_TEMPLATE`) to `out_dir`.

    The template goes into both `tokenizer_config.json` and `chat_template.jinja`, so the tokenizer and the
    processor render prompts alike.
    """
    _write_json(out_dir / "config.json", vl_config_dict(preset, dtype))
    _write_json(out_dir / "preprocessor_config.json", IMAGE_PROCESSOR)
    _write_json(out_dir / "video_preprocessor_config.json", VIDEO_PROCESSOR)
    (out_dir / "chat_template.jinja").write_text(VL_CHAT_TEMPLATE, encoding="utf-8")
    for name in TOKENIZER_FILES:
        if name == "chat_template.jinja" or not (tokenizer_dir / name).is_file():
            continue
        if name == "tokenizer_config.json":
            config = json.loads((tokenizer_dir / name).read_text(encoding="utf-8"))
            config["chat_template"] = VL_CHAT_TEMPLATE
            _write_json(out_dir / name, config)
        else:
            shutil.copyfile(tokenizer_dir / name, out_dir / name)
