"""The reference engine's weights: loading them by checkpoint name, from disk or FP8, and reading them back.

SGLang's weight endpoints (`/update_weights_from_tensor`, `/update_weights_from_disk`, `/get_weights_by_name`,
`/weights_checker`) land here through `ReferenceModel.weights`. Every load and read takes the model's lock, so a
weight update lands between two decode steps, and a bucket is checked whole before any tensor is copied.
"""

from __future__ import annotations

import logging
import pathlib
import threading
from collections.abc import Iterable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file
from torch import nn

from slime_core.config.architecture import config_num_experts
from slime_core.hf_names import to_module_name
from slime_core.moe_experts import expert_slice
from slime_rollout.engines.reference.fp8 import ServedFp8
from slime_rollout.engines.weight_checksum import sglang_checksums

__all__ = ["ServedWeights"]

logger = logging.getLogger(__name__)

# HF model types whose SGLang 0.5.16 class has `get_weights_by_name` (models/llama.py and its subclasses, opt,
# granite, exaone4); every other one answers /get_weights_by_name with HTTP 400.
_SGLANG_READBACK_TYPES = frozenset({"llama", "mistral", "ministral3", "opt", "granite", "exaone4"})


class ServedWeights:
    """The weights of the served model, as SGLang's weight endpoints see them.

    Args:
        model: the transformers model the engine serves.
        lock: the model's lock (`ReferenceModel.lock`), held by every forward.
        model_type: `config.model_type` (names are mapped with `slime_core.hf_names.to_module_name`).
        fp8: the FP8 serving state (`fp8.ServedFp8`): FP8 tensors are dequantized on load.
        model_path: the checkpoint directory the weights came from (`load_from_disk` moves it).
    """

    def __init__(
        self, model: nn.Module, lock: threading.RLock, *, model_type: str, fp8: ServedFp8, model_path: str
    ) -> None:
        """Holds the model; loads nothing (`load_fp8_checkpoint` for an FP8 checkpoint built empty)."""
        self.model, self.lock, self.model_type, self.fp8 = model, lock, model_type, fp8
        self.model_path = model_path

    def load_named_tensors(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Copies tensors into the model's parameters/buffers by Hugging Face checkpoint name.

        Checkpoint names (what SGLang loads, e.g. `visual.*` for Qwen2.5-VL) are mapped to this model's module
        names first (`slime_core.hf_names.to_module_name`); module names pass unchanged. A per-expert MoE matrix
        lands in its slice of transformers' fused expert parameter (`slime_core.moe_experts.expert_slice`).

        The whole bucket is checked before any tensor is copied, so a bucket refused for one bad name or shape
        leaves every weight as it was (copying as it went left the tensors before the bad one applied under the
        old weight version: a mix of two versions behind a failed request).

        Returns:
            Number of tensors loaded.

        Raises:
            KeyError: a name the model does not have.
            ValueError: a shape mismatch (the message names the tensor).
        """
        state = self.model.state_dict()
        with self.lock, torch.no_grad():
            pairs = []
            for name, tensor in self.fp8.dequantized(named_tensors):
                name = to_module_name(name, self.model_type)
                target = self.target(name, state)
                if target is None:
                    raise KeyError(f"update_weights: unknown parameter {name!r}")
                if tuple(target.shape) != tuple(tensor.shape):
                    raise ValueError(
                        f"update_weights: shape mismatch for {name!r}: engine {tuple(target.shape)}, "
                        f"got {tuple(tensor.shape)}"
                    )
                pairs.append((target, tensor))
            for target, tensor in pairs:
                target.copy_(tensor.to(device=target.device, dtype=target.dtype))
        return len(pairs)

    def target(self, name: str, state: dict[str, torch.Tensor]) -> torch.Tensor | None:
        """The tensor of `state` a pushed tensor lands in (a view into a fused parameter), or None for no such weight.

        Args:
            name: a module name (`to_module_name` of the checkpoint name); a per-expert MoE matrix resolves to its
                slice of transformers' fused expert parameter (`slime_core.moe_experts.expert_slice`).
            state: the model's `state_dict()`.
        """
        target = state.get(name)
        if target is None and (where := expert_slice(name, state)) is not None:
            fused, expert, half = where
            target = state[fused][expert]
            if half is not None:
                target = target.chunk(2, dim=0)[half]
        return target

    def zero_weights(self) -> None:
        """Zeroes every parameter: SGLang's weights after a release and resume without a CPU backup."""
        with self.lock, torch.no_grad():
            for param in self.model.parameters():
                param.zero_()

    def weight_checksums(self) -> dict[str, str]:
        """SGLang's `/weights_checker` checksums of the weights held (`slime_rollout.engines.weight_checksum`).

        Names as SGLang's (fused `qkv_proj` / `gate_up_proj`; an MoE layer's experts as `experts.w13_weight` /
        `experts.w2_weight`, from transformers' fused `experts.gate_up_proj` / `experts.down_proj`, which hold the
        same bytes in the same order, or from per-expert modules); a tied `lm_head.weight` is the embedding and, as
        in SGLang's Qwen3, not listed; non-persistent buffers (rotary tables) are not weights.
        """
        state = self.model.state_dict()
        text_config = self.model.config.get_text_config()
        if getattr(text_config, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        num_experts = config_num_experts(text_config.to_dict())
        with self.lock:
            items = self.fp8.checksum_items({k: v.detach() for k, v in state.items()})  # FP8: e4m3 + scales held
            return sglang_checksums(items, dtype=self.model.dtype, num_experts=num_experts)

    def get_weights_by_name(self, name: str, truncate_size: int = 100) -> list:
        """A parameter's first `truncate_size` entries along dim 0 as float32 lists (SGLang's `/get_weights_by_name`).

        Only for the model types whose SGLang class implements it (`_SGLANG_READBACK_TYPES`; Qwen3 answers 400
        there, so here too). Checkpoint names (e.g. `visual.*` for Qwen2.5-VL) are mapped as in `load_named_tensors`;
        module names pass unchanged. As SGLang, a tied `lm_head.weight` reads the embedding. For a 2-D weight the
        result is a list of rows.

        Raises:
            KeyError: the model has no such parameter or buffer.
        """
        if self.model_type not in _SGLANG_READBACK_TYPES:
            raise KeyError(f"get_weights_by_name: SGLang's {self.model_type} model class does not implement it")
        state = self.model.state_dict()
        module_name = to_module_name(name, self.model_type)
        tied = getattr(self.model.config.get_text_config(), "tie_word_embeddings", False)
        if module_name not in state and name == "lm_head.weight" and tied:
            module_name = next((k for k in state if k.endswith("embed_tokens.weight")), module_name)
        if module_name not in state:
            raise KeyError(f"get_weights_by_name: unknown parameter {name!r}")
        with self.lock:
            return state[module_name][:truncate_size].detach().to("cpu", torch.float32).tolist()

    def load_fp8_checkpoint(self) -> None:
        """Loads the FP8 serving checkpoint the engine was started on; every weight of the model must be in it.

        Raises:
            ValueError: the checkpoint lacks some of the model's weights (names a few).
        """
        state = self.model.state_dict()
        if getattr(self.model.config.get_text_config(), "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)  # the embedding, loaded under its own name
        held = set()
        for f in pathlib.Path(self.model_path).glob("*.safetensors"):
            with safe_open(str(f), framework="pt") as handle:
                held.update(to_module_name(k, self.model_type) for k in handle.keys())  # noqa: SIM118
        missing = sorted(set(state) - held)
        if missing:
            raise ValueError(f"{self.model_path}: the FP8 checkpoint lacks {len(missing)} weights, e.g. {missing[:3]}")
        self.load_from_disk(self.model_path)

    def load_from_disk(self, model_path: str) -> int:
        """Loads every `*.safetensors` file of an HF checkpoint directory into the model.

        All files are checked as one bucket before any weight is copied (file by file, a bad later shard left the
        earlier ones applied under the old version).

        Raises:
            FileNotFoundError: no safetensors file. KeyError: an unknown name. ValueError: a shape mismatch or a
                truncated file (named).
        """
        files = sorted(pathlib.Path(model_path).glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"update_weights_from_disk: no *.safetensors in {model_path}")
        named: list[tuple[str, torch.Tensor]] = []
        for f in files:
            try:
                named.extend(load_file(str(f)).items())
            except SafetensorError as e:
                raise ValueError(f"update_weights_from_disk: {f} is not a complete safetensors file ({e})") from e
        n = self.load_named_tensors(named)
        self.model_path = str(model_path)
        logger.info("loaded %d tensors from %s", n, model_path)
        return n
