"""LoRA adapters for the reference engine: SGLang's `/load_lora_adapter` subset on a transformers model.

An adapter is a PEFT directory (`slime_core.lora`): `adapter_config.json` (`r`, `lora_alpha`) and
`adapter_model.safetensors` (`...<module>.lora_A.weight` `[r, in]`, `...lora_B.weight` `[out, r]`). Adapters are
kept next to the base weights, never merged into them, so one engine serves the base model and every loaded
adapter: a forward hook on each adapted `nn.Linear` adds `(alpha / r) · x Aᵀ Bᵀ` of the adapter `active` for the
batch being run (the scheduler batches requests of one adapter together, `lora_path` of `/generate`).
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from slime_core.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, module_of

__all__ = ["LoraAdapters"]


class LoraAdapters:
    """The adapters loaded into one model, and which one the current batch uses.

    Args:
        model: the engine's transformers model (HF module names).

    Attributes:
        active: name of the adapter applied by the hooks (None: the base model).
        paths: name → directory it was loaded from (SGLang's `loaded_adapters`).
    """

    def __init__(self, model: nn.Module):
        self.model = model
        self.modules = dict(model.named_modules())
        self.active: str | None = None
        self.paths: dict[str, str] = {}
        self._weights: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor, float]]] = {}
        self._hooked: set[str] = set()

    def __contains__(self, name: object) -> bool:
        return name in self._weights

    def load(self, name: str, path: str) -> None:
        """Reads the PEFT adapter at `path` and registers it as `name` (replacing an adapter of that name).

        The update is scaled by `lora_alpha / r` and DoRA is refused, as SGLang does (`use_rslora` is not read).

        Raises:
            FileNotFoundError: `path` lacks `adapter_config.json` or `adapter_model.safetensors`.
            ValueError: a DoRA adapter, a tensor that names no linear layer of the model, a shape that does not
                fit, or a missing A/B.
        """
        root = pathlib.Path(path)
        for f in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
            if not (root / f).exists():
                raise FileNotFoundError(f"load_lora_adapter: {root / f} does not exist")
        config = json.loads((root / ADAPTER_CONFIG).read_text())
        if config.get("use_dora"):
            raise ValueError(f"load_lora_adapter {name}: DoRA adapters are not served (as SGLang refuses them)")
        rank = int(config["r"])
        # SGLang 0.5.16 scales every adapter by alpha / r and never reads `use_rslora` (srt/lora/lora.py).
        scale = float(config["lora_alpha"]) / rank
        pairs: dict[str, dict[str, torch.Tensor]] = {}
        for tensor_name, tensor in load_file(str(root / ADAPTER_WEIGHTS)).items():
            module, part = module_of(tensor_name)
            pairs.setdefault(module, {})[part] = tensor
        weights = {}
        for module, pair in pairs.items():
            linear = self.modules.get(module)
            if not isinstance(linear, nn.Linear):
                raise ValueError(f"load_lora_adapter {name}: {module!r} is not a linear layer of the model")
            if set(pair) != {"lora_A", "lora_B"}:
                raise ValueError(f"load_lora_adapter {name}: {module!r} lacks lora_A or lora_B")
            a, b = pair["lora_A"], pair["lora_B"]
            if a.shape != (rank, linear.in_features) or b.shape != (linear.out_features, rank):
                raise ValueError(
                    f"load_lora_adapter {name}: {module!r} A {tuple(a.shape)} / B {tuple(b.shape)} do not fit "
                    f"r={rank} on a {linear.in_features}->{linear.out_features} layer"
                )
            weight = linear.weight
            weights[module] = (a.to(weight.device, weight.dtype), b.to(weight.device, weight.dtype), scale)
        for module in weights:
            self._hook(module)
        self._weights[name] = weights
        self.paths[name] = str(root)

    def unload(self, name: str) -> None:
        """Forgets adapter `name`.

        Raises:
            KeyError: no adapter of that name is loaded.
        """
        if name not in self._weights:
            raise KeyError(f"unload_lora_adapter: no adapter {name!r} is loaded (loaded: {sorted(self._weights)})")
        del self._weights[name]
        del self.paths[name]

    def _hook(self, module: str) -> None:
        if module in self._hooked:
            return

        def add_update(layer: nn.Module, inputs: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
            entry = self._weights.get(self.active, {}).get(module) if self.active is not None else None
            if entry is None:
                return output
            a, b, scale = entry
            return output + scale * ((inputs[0] @ a.T) @ b.T)

        self.modules[module].register_forward_hook(add_update)
        self._hooked.add(module)
