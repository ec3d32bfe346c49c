"""SGLang's own kernels for the trainer's mirrored forward, imported lazily and only on CUDA.

SGLang is a server-only dependency (`slime-rollout[sglang]`): CPU CI and the package-isolation runs do not have
it, so nothing here imports it at module load. On CUDA, `--true-on-policy-mode` needs it (the exact kernels
exist nowhere else) and a missing SGLang is one clear error; on CPU the mode runs the pure-torch fallback of the
same op order and says once that bit-exactness is only promised on the GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import types

import torch

__all__ = ["SGLangKernels", "enable_batch_invariant_ops", "load_kernels"]

logger = logging.getLogger(__name__)

_INSTALL_HINT = "install the engine's SGLang (slime-rollout[sglang], sglang==0.5.16) in the trainer's environment"


@dataclasses.dataclass(frozen=True, slots=True)
class SGLangKernels:
    """The SGLang 0.5.16 triton attention kernels the engine runs under `--enable-deterministic-inference`.

    Attributes:
        extend_unified: `sglang.kernels.ops.attention.extend_attention.extend_attention_fwd_unified`, the 1-stage
            prefill kernel (prefix and new tokens read through one `kv_indices`).
        decode: `sglang.kernels.ops.attention.decode_attention.decode_attention_fwd`, the split-KV decode kernel.
        split_tile_size: KV tokens per decode split (`SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE`, SGLang's default 256).
        rotary: `sglang.srt.layers.rotary_embedding.utils.apply_rotary_emb` wrapped in `torch.compile(dynamic=True)`,
            as SGLang wraps it under `rl_on_policy_target` (`rotary_embedding/base.py`).
    """

    extend_unified: types.FunctionType
    decode: types.FunctionType
    split_tile_size: int
    rotary: types.FunctionType


_STATE: dict[str, object] = {}


# Environment variables that pick SGLang's matmul and decode-split kernels; the engine inherits them from the same
# driver, and they must be equal in both processes for the numerics to match (logged once here to make that visible).
KERNEL_ENV = (
    "SGLANG_ENABLE_JIT_DEEPGEMM",
    "SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_DEEPGEMM",
    "SGLANG_BATCH_INVARIANT_OPS_ENABLE_MM_FALLBACK_VARIANT",
    "SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE",
)


@contextlib.contextmanager
def keep_trainer_configs():
    """While SGLang's modules import, skips their `AutoConfig.register` of model types transformers already has.

    `sglang.srt.configs` (pulled in by the batch-invariant ops) registers its own copies of some configs
    (`qwen3_asr`, ...) with transformers' `AutoConfig`. A newer transformers in the trainer ships them and raises
    `ValueError: 'qwen3_asr' is already used by a Transformers config` (seen on the H200 with SGLang 0.5.16 and
    transformers 5.x). The trainer keeps its own config classes; new model types still register. Restored on exit.
    """
    try:
        from transformers import AutoConfig
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    except ImportError:
        yield []
        return
    original = AutoConfig.__dict__["register"]
    skipped: list[str] = []

    def register(model_type, config, exist_ok=False):
        if model_type in CONFIG_MAPPING and not exist_ok:
            skipped.append(model_type)
            return None
        return original.__func__(model_type, config, exist_ok=exist_ok)

    AutoConfig.register = staticmethod(register)
    try:
        yield skipped
    finally:
        AutoConfig.register = original
        if skipped:
            logger.info("SGLang's config registrations skipped (transformers has them): %s", ", ".join(skipped))


def _import(module: str, name: str):
    """`module.name`, falling back to the engine's staged site dir (`SLIME_SGLANG_PYTHONPATH`, appended last)."""
    with keep_trainer_configs():
        return _import_unguarded(module, name)


def _import_unguarded(module: str, name: str):
    try:
        mod = __import__(module, fromlist=[name])
    except ImportError as first:
        staged = [p for p in os.environ.get("SLIME_SGLANG_PYTHONPATH", "").split(os.pathsep) if p]
        missing = [p for p in staged if p not in sys.path]
        if not missing:
            raise RuntimeError(
                f"--true-on-policy-mode on CUDA needs {module}.{name} ({first}); {_INSTALL_HINT}"
            ) from first
        # Appended, not prepended: the trainer's own packages (torch, transformers) keep precedence.
        sys.path.extend(missing)
        logger.info("--true-on-policy-mode: importing SGLang's kernels from SLIME_SGLANG_PYTHONPATH %s", missing)
        try:
            mod = __import__(module, fromlist=[name])
        except ImportError as e:
            raise RuntimeError(
                f"--true-on-policy-mode on CUDA needs {module}.{name} (also not under SLIME_SGLANG_PYTHONPATH: {e}); "
                f"{_INSTALL_HINT}"
            ) from e
    return getattr(mod, name)


def enable_batch_invariant_ops(device: torch.device) -> bool:
    """Installs SGLang's batch-invariant `aten::mm/addmm/_log_softmax/mean.dim/rms_norm` overrides (CUDA only).

    The same call the original slime's FSDP actor makes for the mode
    (`sglang.srt.batch_invariant_ops.enable_batch_invariant_mode(enable_bmm=False)`): the engine runs with them
    (`--enable-deterministic-inference`), so the trainer must too for its matmuls to round the same way. They
    apply process-wide from then on (backward and the optimizer included), which is part of the mode's cost.

    Args:
        device: the trainer's device; on CPU nothing is installed and a warning says so, once.

    Returns:
        True when the overrides are active.

    Raises:
        RuntimeError: on CUDA without SGLang.
    """
    if device.type != "cuda":
        if not _STATE.get("cpu_warned"):
            _STATE["cpu_warned"] = True
            logger.warning(
                "--true-on-policy-mode on %s: running the mirrored Qwen3 forward with pure-torch ops; its log-probs "
                "equal SGLang's bit for bit only on CUDA with SGLang's kernels",
                device.type,
            )
        return False
    enable = _import("sglang.srt.batch_invariant_ops", "enable_batch_invariant_mode")
    enable(enable_bmm=False)
    logger.info(
        "--true-on-policy-mode: SGLang batch-invariant ops enabled in the trainer (%s; the engine must see the same)",
        ", ".join(f"{k}={os.environ.get(k, '<unset>')}" for k in KERNEL_ENV),
    )
    return True


def load_kernels(device: torch.device) -> SGLangKernels | None:
    """SGLang's triton attention kernels on CUDA, None on CPU (the caller then uses the torch fallback).

    Raises:
        RuntimeError: on CUDA without SGLang.
    """
    if device.type != "cuda":
        return None
    if "kernels" not in _STATE:
        _STATE["kernels"] = SGLangKernels(
            extend_unified=_import("sglang.kernels.ops.attention.extend_attention", "extend_attention_fwd_unified"),
            decode=_import("sglang.kernels.ops.attention.decode_attention", "decode_attention_fwd"),
            # SGLang reads the same variable (triton_backend.py, deterministic branch); the engine inherits this
            # process's environment, so both see one value.
            split_tile_size=int(os.environ.get("SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE", "256")),
            rotary=torch.compile(dynamic=True)(_import("sglang.srt.layers.rotary_embedding.utils", "apply_rotary_emb")),
        )
    return _STATE["kernels"]  # type: ignore[return-value]
