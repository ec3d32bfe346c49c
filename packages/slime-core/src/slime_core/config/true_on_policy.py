"""`--true-on-policy-mode`: what the mode covers (preflight) and the SGLang server flags it implies.

The mode (the original slime's flag, FSDP only) makes the trainer's log-probs of a rollout bit-identical to the
ones SGLang returned for it. SGLang is put in its own RL on-policy mode (`--rl-on-policy-target fsdp`, which also
turns on `--enable-deterministic-inference`: batch-invariant matmul/log-softmax/mean, a fixed split of the
triton decode kernel, sampling from log-probs with the request's `sampling_seed`); the FSDP trainer replays the
same op order with the same kernels (`slime_train_fsdp.true_on_policy`).

What it does not cover is refused here, one line per rule, before anything starts: another training backend,
a model other than a dense Qwen3 (read from `--hf-checkpoint`'s config.json), trainer or engine parallelism that
splits a matmul or the sequence, FP8 rollout, LoRA, top-p/top-k sampling (SGLang then samples from filtered
probabilities while it still returns the plain log-probs), partial rollouts, multi-turn environments, and an
attention backend other than the one the trainer mirrors.
"""

from __future__ import annotations

import json
import pathlib
from typing import TYPE_CHECKING

from slime_core.config.base import ConfigError
from slime_core.extensions import engine_spec, train_backend_spec

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

__all__ = [
    "ENGINE_FP32_PARAM_SUFFIXES",
    "MIRRORED_ATTENTION_BACKEND",
    "SUPPORTED_ARCHITECTURES",
    "check_true_on_policy",
    "true_on_policy_server_args",
]

#: SGLang attention backend the trainer reproduces (its triton extend/decode kernels; FA3 is absent on the
#: GPU image, and `--enable-deterministic-inference` refuses backends that are not batch invariant).
MIRRORED_ATTENTION_BACKEND = "triton"

#: Parameters SGLang holds in fp32 under `--rl-on-policy-target` (its Qwen2/Qwen3 `embed_tokens` with
#: `params_dtype=fp32`, every RMSNorm with `weight_dtype=fp32`), whatever the checkpoint dtype: weight checks hash
#: the pushed (bf16) values in fp32 for them.
ENGINE_FP32_PARAM_SUFFIXES = ("embed_tokens.weight", "norm.weight")

#: `architectures[0]` of the HF configs the mirrored forward implements (SGLang's `Qwen3ForCausalLM`).
SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM",)


def true_on_policy_server_args(cfg: SlimeArgs) -> list[str]:
    """SGLang CLI tokens the mode adds to every engine's launch; empty when the mode is off.

    `--rl-on-policy-target fsdp` makes SGLang's Qwen3 run the native RMSNorm/RoPE/SiLU paths with fp32 norm
    weights, an fp32 residual stream and a bf16 `lm_head`, and compute log-probs as
    `log_softmax(logits.bf16 / T -> bf16)`; it turns on `--enable-deterministic-inference` itself, given here too
    so the command line says what runs. The sampling seed of each request is its `sampling_seed`
    (`slime_rollout.generation.seeds`); `--random-seed` (set by the launcher) seeds the rest.

    Args:
        cfg: reads `true_on_policy_mode`.

    Returns:
        `["--rl-on-policy-target", "fsdp", "--enable-deterministic-inference", "--attention-backend", "triton"]`
        in the mode, else `[]`.
    """
    if not cfg.true_on_policy_mode:
        return []
    return [
        "--rl-on-policy-target",
        "fsdp",
        "--enable-deterministic-inference",
        "--attention-backend",
        MIRRORED_ATTENTION_BACKEND,
    ]


def _hf_config(hf_checkpoint: str | None) -> dict:
    """`hf_checkpoint/config.json` as a dict, `{}` when there is none (yet)."""
    if not hf_checkpoint:
        return {}
    path = pathlib.Path(hf_checkpoint) / "config.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"--true-on-policy-mode: cannot read {path}: {e}") from e


def _sglang_value(cfg: SlimeArgs, key: str) -> object:
    return cfg.sglang_args.get(key, cfg.sglang_args.get(f"sglang_{key}"))


def check_true_on_policy(cfg: SlimeArgs) -> None:
    """Refuses `--true-on-policy-mode` together with what it does not cover (see the module docstring).

    A checkpoint directory that does not exist yet (a config validated away from the GPU machine) is not
    inspected; the trainer checks the model again when it builds it.

    Args:
        cfg: the config under validation.

    Raises:
        ConfigError: one line naming the flag (or config.json field) that conflicts with the mode.
    """
    if not cfg.true_on_policy_mode:
        return
    flag = "--true-on-policy-mode"
    if not getattr(train_backend_spec(cfg), "supports_true_on_policy", False):
        raise ConfigError(
            f"{flag} is implemented by --train-backend fsdp only, got --train-backend {cfg.train_backend}"
        )
    hf = _hf_config(cfg.hf_checkpoint)
    model_type, arch = hf.get("model_type"), (hf.get("architectures") or [None])[0]
    if arch is not None and arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(
            f"{flag}: {cfg.hf_checkpoint}/config.json has architectures [{arch!r}] (model_type {model_type!r}); the "
            f"mirrored forward covers dense Qwen3 ({', '.join(SUPPORTED_ARCHITECTURES)}) only"
        )
    if engine_spec(cfg).needs_gpu:  # a GPU engine (SGLang) serves the checkpoint's dtype; the mirror casts to bf16
        dtype = str(_sglang_value(cfg, "dtype") or "auto")
        if dtype == "auto":
            dtype = str(hf.get("dtype") or hf.get("torch_dtype") or "bfloat16")
        if dtype != "bfloat16":
            raise ConfigError(
                f"{flag}: the engine would serve {dtype} weights ({cfg.hf_checkpoint}/config.json or --sglang-dtype); "
                "the mode mirrors SGLang's bf16 path: use a bfloat16 checkpoint"
            )
    if cfg.context_parallel_size > 1:
        raise ConfigError(
            f"{flag} with --context-parallel-size {cfg.context_parallel_size}: use 1 (CP splits attention)"
        )
    if cfg.rollout_num_gpus_per_engine != 1:
        raise ConfigError(
            f"{flag} with --rollout-num-gpus-per-engine {cfg.rollout_num_gpus_per_engine}: engine TP splits every "
            "matmul's reduction; use 1 GPU per engine"
        )
    for key in ("tp_size", "dp_size", "pp_size", "ep_size"):
        value = _sglang_value(cfg, key)
        if value is not None and int(value) != 1:  # type: ignore[call-overload]
            raise ConfigError(f"{flag} with --sglang-{key.replace('_', '-')} {value}: use 1")
    # These run generated tokens through the prefill kernel instead of the decode kernel the trainer mirrors.
    for key in ("enable_mixed_chunk", "speculative_algorithm"):
        value = _sglang_value(cfg, key)
        if value not in (None, False, "", "None"):
            raise ConfigError(
                f"{flag} with --sglang-{key.replace('_', '-')} {value}: generated tokens would be scored by SGLang's "
                "prefill kernel, not the decode kernel the trainer mirrors; drop it"
            )
    backend = _sglang_value(cfg, "attention_backend")
    if backend is not None and backend != MIRRORED_ATTENTION_BACKEND:
        raise ConfigError(
            f"{flag} with --sglang-attention-backend {backend}: the trainer mirrors SGLang's "
            f"{MIRRORED_ATTENTION_BACKEND} kernels; drop the flag"
        )
    from slime_core.fp8 import read_fp8_config  # imports torch: not at config import (--help stays torch-free)

    if read_fp8_config(cfg.hf_checkpoint) is not None:
        raise ConfigError(f"{flag}: {cfg.hf_checkpoint} is an FP8 checkpoint; the engine must serve the bf16 weights")
    if cfg.lora_rank:
        raise ConfigError(f"{flag} with --lora-rank {cfg.lora_rank}: LoRA adds matmuls SGLang runs differently")
    if cfg.rollout_top_p < 1 or cfg.rollout_top_k > 0:
        raise ConfigError(
            f"{flag} with --rollout-top-p {cfg.rollout_top_p} / --rollout-top-k {cfg.rollout_top_k}: SGLang samples "
            "from log-probs (deterministically) only without top-p/top-k; use 1.0 / -1"
        )
    if cfg.partial_rollout:
        raise ConfigError(f"{flag} with --partial-rollout: a resumed sample's prefix is re-prefilled; drop it")
    if cfg.env_path or cfg.max_turns > 1:
        raise ConfigError(
            f"{flag} with --env-path/--max-turns {cfg.max_turns}: tool output is prefilled mid-response, which the "
            "mirrored forward does not reproduce; the mode covers single-turn samples"
        )
    if cfg.update_weight_mode == "delta":
        raise ConfigError(
            f"{flag} with --update-weight-mode delta: the engine holds embeddings and norms in fp32 under the mode, "
            "which byte deltas of the pushed bf16 tensors do not describe; use full"
        )
    if cfg.multimodal_keys:
        raise ConfigError(f"{flag} with --multimodal-keys: vision-language models are not covered")
    # The mode fixes the trainer's kernels itself; a flag choosing other ones would be ignored.
    for field, value in (
        ("log_probs_head", cfg.log_probs_head),
        ("attn_implementation", cfg.attn_implementation),
        ("fsdp_compile_layers", cfg.fsdp_compile_layers or None),
    ):
        if value is not None:
            raise ConfigError(
                f"{flag} with --{field.replace('_', '-')} {value}: the mode runs SGLang's own kernels for this; "
                "drop the flag"
            )
