"""`--hf-checkpoint`'s folder and an HF OPD teacher's, checked before anything starts.

Its JSON files parse, its `model_type` is one transformers builds, it holds the weights whoever loads them reads,
and a trainer-side teacher has the student's architecture and vocabulary.
"""

from __future__ import annotations

import logging
import os

from slime_app.checkpoint_kinds import checkpoint_kind
from slime_core.config import SlimeArgs
from slime_core.extensions import train_backend_spec
from slime_core.hf_checkpoint import INDEX_NAME, read_weight_map

logger = logging.getLogger(__name__)

__all__ = [
    "KNOWN_MODEL_TYPES",
    "check_hf_weights",
    "check_json_files",
    "check_model_type",
    "check_opd_teacher",
    "weight_readers",
]


# The JSON files of a model folder that config, tokenizer and weight loading parse.
_MODEL_JSON = ("config.json", "tokenizer_config.json", "tokenizer.json", "generation_config.json",
               "model.safetensors.index.json", "preprocessor_config.json", "processor_config.json")  # fmt: skip


def check_json_files(folder: str) -> None:
    """Each JSON file of `--hf-checkpoint` the run parses must be valid UTF-8 JSON, its shard index inside the folder.

    A truncated copy said only `Expecting ',' delimiter: line 2 column 1 (char 23)`, naming no file.

    Raises:
        ValueError: naming the flag, the file, its line and column; or the index key whose shard is an absolute
            path or climbs out with `..` (`slime_core.hf_checkpoint.read_weight_map`).
    """
    import json

    for name in _MODEL_JSON:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8") as f:
                json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"--hf-checkpoint {folder}: {name} is not valid JSON (line {e.lineno} column {e.colno}: {e.msg}); "
                "a partial download or copy?"
            ) from None
        except UnicodeDecodeError as e:
            raise ValueError(f"--hf-checkpoint {folder}: {name} is not UTF-8 (byte offset {e.start})") from None
    index = os.path.join(folder, INDEX_NAME)
    if os.path.isfile(index):
        try:  # transformers, the engines and the converter follow its shard names as given
            read_weight_map(index)
        except ValueError as e:
            raise ValueError(f"--hf-checkpoint: {e}") from None


# Model types the workspace's transformers (pinned in uv.lock) builds, and the ones slime's stacks serve and train:
# their check needs no `import transformers`, which the driver otherwise does for this lookup alone (measured: 1.2
# CPU-s on top of torch, in every run and preflight). tests/apps/test_preflight_model_type.py checks the set against
# transformers' own mapping, so an upgrade that drops one fails there.
KNOWN_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen2_moe", "qwen2_vl", "qwen2_5_vl", "qwen3", "qwen3_moe",
                               "qwen3_vl", "qwen3_vl_moe", "glm4"})  # fmt: skip


def check_model_type(folder: str) -> None:
    """config.json's `model_type` must be one transformers builds or bring its code (an unknown one failed in Ray).

    A type in `KNOWN_MODEL_TYPES` passes without importing transformers; any other is looked up in
    `transformers.CONFIG_MAPPING`.

    Raises:
        ValueError: naming the flag, the folder, the model type and the transformers version.
    """
    import json

    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if not isinstance(config, dict) or config.get("auto_map") or model_type in KNOWN_MODEL_TYPES:
        return
    import transformers

    if model_type in transformers.CONFIG_MAPPING:
        return
    raise ValueError(
        f"--hf-checkpoint {folder}: config.json's model_type {model_type!r} is not one transformers "
        f"{transformers.__version__} knows, and config.json names no code of its own (auto_map); the engines and the "
        "trainer build the model from it: give a model of a supported type"
    )


def weight_readers(cfg: SlimeArgs) -> dict[str, str]:
    """Who reads `--hf-checkpoint`'s weights in this run, `"engines"` and/or `"trainer"`, with how (for messages)."""
    from slime_core.fp8 import trainer_weights_dir

    readers = {}
    if cfg.rollout_engine and not (cfg.rollout_engine_urls or cfg.debug_train_only):
        readers["engines"] = f"the --rollout-engine {cfg.rollout_engine} engines load them at start"
    if not cfg.debug_rollout_only:
        torch_dist_start = (
            train_backend_spec(cfg).reads_torch_dist
            and cfg.ref_load
            and (checkpoint_kind(cfg.ref_load) == "torch_dist")
        )  # Megatron starts from a torch_dist --ref-load, not from --hf-checkpoint
        starts_here = os.path.realpath(trainer_weights_dir(cfg.hf_checkpoint, cfg.ref_load)) == os.path.realpath(
            cfg.hf_checkpoint
        )
        if starts_here and not torch_dist_start:
            trainer = f"the --train-backend {cfg.train_backend} trainer"
            readers["trainer"] = f"{trainer} loads its *.safetensors (also before --load)"
    return readers


def check_hf_weights(cfg: SlimeArgs) -> None:
    """`--hf-checkpoint` must hold weights when engines or the trainer load them (a config-only folder passed).

    The trainers read `*.safetensors` only (`slime_train_fsdp.model_loading.read_hf_state_dict`, Megatron's
    `load_hf_weights`); engines also read PyTorch `*.bin` files.

    Raises:
        FileNotFoundError: naming the flag, the folder and who would load the weights.
    """
    readers = weight_readers(cfg)
    if not readers:
        return
    files = [p.name for p in os.scandir(cfg.hf_checkpoint) if p.is_file()]
    safetensors = any(name.endswith(".safetensors") for name in files)
    if safetensors or ("trainer" not in readers and any(name.endswith((".bin", ".pt")) for name in files)):
        return
    shown = ", ".join(sorted(files)[:6]) + (", ..." if len(files) > 6 else "")
    if any(n.endswith((".bin", ".pt")) for n in files):
        found = f"only PyTorch *.bin/*.pt weights, no *.safetensors ({shown})"
        fix = "convert them to safetensors (`save_pretrained(DIR, safe_serialization=True)`)"
    else:
        found = f"no weight files, only {shown or 'nothing'}"
        fix = "give the folder with the model's weights (`huggingface-cli download <model> --local-dir DIR`)"
    who = " and ".join(readers.values())
    raise FileNotFoundError(f"--hf-checkpoint {cfg.hf_checkpoint}: {found}, but {who}; {fix}")


def check_opd_teacher(cfg: SlimeArgs) -> None:
    """A trainer-side OPD teacher given as an HF directory must have the student's architecture and tokenizer.

    Torch-dist and FSDP checkpoints carry no config.json; their shapes are checked when they load.

    Raises:
        ValueError: a field of `slime_app.checkpoint_shapes.ARCHITECTURE_FIELDS` differs (message names both values).
    """
    from slime_app.checkpoint_shapes import config_mismatches, read_config

    teacher_config = os.path.join(cfg.opd_teacher_load or "", "config.json")
    if not (cfg.use_opd and cfg.opd_teacher_load and cfg.hf_checkpoint and os.path.exists(teacher_config)):
        return
    mismatches = config_mismatches(read_config(cfg.hf_checkpoint), read_config(cfg.opd_teacher_load))
    differ = [f"{k}: teacher {teacher!r} vs student {student!r}" for k, teacher, student in mismatches]
    if differ:
        raise ValueError(
            f"--opd-teacher-load {cfg.opd_teacher_load}: the trainer-side teacher must have the student's "
            f"(--hf-checkpoint) architecture; config.json differs in {'; '.join(differ)} (a teacher of another "
            "architecture can be served by an engine: --opd-type sglang)"
        )
    _check_teacher_vocabulary(cfg)


def _check_teacher_vocabulary(cfg: SlimeArgs) -> None:
    """The trainer-side teacher reads the student's token ids: its tokenizer must map text to the same ids.

    A teacher of the same vocabulary size but another vocabulary passed the config.json check and scored every
    sampled id as some other token (training on nonsense). Checked where the teacher's folder has tokenizer files;
    one without them is said once in the log.

    Raises:
        ValueError: naming both paths, the vocabulary sizes and whether the token-to-id maps differ.
    """
    from slime_rollout.data.tokenizer import has_tokenizer_files, vocabulary_fingerprint

    if not has_tokenizer_files(cfg.opd_teacher_load):
        logger.warning(
            "--opd-teacher-load %s has no tokenizer files: whether the teacher shares the student's vocabulary "
            "(--hf-checkpoint %s) is not checked",
            cfg.opd_teacher_load,
            cfg.hf_checkpoint,
        )
        return
    (student_size, student), (teacher_size, teacher) = (
        vocabulary_fingerprint(cfg.hf_checkpoint),
        vocabulary_fingerprint(cfg.opd_teacher_load),
    )
    if student != teacher:
        how = (
            f"{teacher_size:,} tokens vs the student's {student_size:,}"
            if teacher_size != student_size
            else f"the same {teacher_size:,} tokens mapped to other ids"
        )
        raise ValueError(
            f"--opd-teacher-load {cfg.opd_teacher_load}: its tokenizer is not the student's (--hf-checkpoint "
            f"{cfg.hf_checkpoint}): {how}; the teacher scores the student's token ids, so it needs the same "
            "vocabulary (a teacher of another tokenizer cannot distil token by token)"
        )
