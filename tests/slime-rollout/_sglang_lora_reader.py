"""A PEFT adapter directory read the way SGLang 0.5.16 reads it, without SGLang (a test helper, no test itself).

`read_like_sglang(path, server_flags)` follows `sglang/srt/lora` step by step, so a CPU test sees what the engine
would serve from the files slime writes:

- `lora_config.LoRAConfig`: `adapter_config.json` gives `r`, `lora_alpha`, `target_modules`, `use_dora`;
  `lora.LoRAAdapter.__init__`: `peft_type` must be `lora`, the scale is `lora_alpha / r` (`use_rslora` is never
  read), DoRA is refused (`lora_manager.validate_new_adapter`).
- `mem_pool.LoRAMemoryPool.can_support`: `r <= --max-lora-rank` and the normalized `target_modules`
  (`utils.get_normalized_target_modules`: q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj) within the
  normalized `--lora-target-modules`.
- `lora.LoRAAdapter.initialize_weights`: every `*.safetensors` of the directory; a name's layer is
  `layers\\.(\\d+)\\.` (`layers/utils/common.get_layer_id`); names without a layer (embeddings, lm_head) are not
  read unless targeted; `normalize_qkv_proj` concatenates q, k, v (A and B, dim 0; a missing k is zeros),
  `normalize_gate_up_proj` gate and up.
- `mem_pool.load_lora_weight_to_buffer`: every name must match a server target module (`get_target_module_name`,
  longest substring), else SGLang skips it with a warning: here an error, since a skipped tensor is an adapter
  the engine does not serve.

`delta_weights` turns what was read into `{HF linear name: scale · B A}` (the slices SGLang's kernels apply to each
of q, k, v and gate, up), so a test merges them into the base model and compares log-probs with the trainer's.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re

import torch
from safetensors.torch import load_file

_NORMALIZED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
               "up_proj": "gate_up_proj"}  # fmt: skip
_STACKED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@dataclasses.dataclass
class SGLangAdapter:
    """What SGLang holds after `/load_lora_adapter`.

    Attributes:
        rank: `r`.
        scaling: `lora_alpha / r`, applied to B when copied into the memory pool.
        weights: `{layer id: {normalized name: tensor}}` under the adapter's own names with q/k/v and gate/up
            stacked (A `[c·r, in]`, B `[sum of outs, r]`).
    """

    rank: int
    scaling: float
    weights: dict[int, dict[str, torch.Tensor]]


def normalized_targets(modules: list[str]) -> set[str]:
    """`sglang.srt.lora.utils.get_normalized_target_modules` for the names slime uses."""
    return {_NORMALIZED.get(m.split(".")[-1], m.split(".")[-1]) for m in modules}


def server_flags(cmd: list[str]) -> tuple[int, list[str]]:
    """`--max-lora-rank` and `--lora-target-modules` of an SGLang command line (nargs="*" values)."""
    i = cmd.index("--max-lora-rank")
    j = cmd.index("--lora-target-modules") + 1
    targets = []
    while j < len(cmd) and not cmd[j].startswith("--"):
        targets.append(cmd[j])
        j += 1
    return int(cmd[i + 1]), targets


def read_like_sglang(path: str | pathlib.Path, *, max_lora_rank: int, target_modules: list[str]) -> SGLangAdapter:
    """Reads a PEFT adapter directory as SGLang 0.5.16 does (see the module docstring).

    Args:
        path: the adapter directory.
        max_lora_rank: the server's `--max-lora-rank`.
        target_modules: the server's `--lora-target-modules`.

    Raises:
        ValueError: SGLang would refuse the adapter, or would skip one of its tensors.
    """
    root = pathlib.Path(path)
    config = json.loads((root / "adapter_config.json").read_text())
    if config["peft_type"].lower() != "lora":
        raise ValueError(f"peft_type {config['peft_type']!r}: SGLang asserts 'lora'")
    if config.get("use_dora", False):
        raise ValueError("SGLang refuses DoRA adapters")
    rank, alpha = config["r"], config["lora_alpha"]
    server = normalized_targets(target_modules)
    if rank > max_lora_rank or not normalized_targets(config["target_modules"]) <= server:
        raise ValueError(f"r={rank}, target_modules {config['target_modules']}: not supported by --max-lora-rank "
                         f"{max_lora_rank} --lora-target-modules {target_modules}")  # fmt: skip
    layers: dict[int, dict[str, torch.Tensor]] = {}
    for f in sorted(root.glob("*.safetensors")):
        for name, tensor in load_file(str(f)).items():
            match = re.search(r"layers\.(\d+)\.", name)
            if match is None:
                raise ValueError(f"{name}: no layer id; SGLang reads embed_tokens/lm_head only when targeted")
            layers.setdefault(int(match.group(1)), {})[name] = tensor.float()
    for weights in layers.values():
        _stack(weights)
        for name in weights:
            if not any(t in name for t in server):  # get_target_module_name raises; the pool skips the tensor
                raise ValueError(f"{name}: matches no --lora-target-modules {sorted(server)}; SGLang skips it")
    return SGLangAdapter(rank=rank, scaling=alpha / rank, weights=layers)


def _stack(weights: dict[str, torch.Tensor]) -> None:
    """`normalize_qkv_proj` and `normalize_gate_up_proj`: `[q; k; v]` and `[gate; up]` along dim 0.

    As SGLang: a missing k is `zeros_like(v)`, a missing up `zeros_like(gate)`; a missing v raises (SGLang's
    KeyError); k or v without q, or up without gate, stay unstacked (and then match no target module).
    """
    for name in [n for n in weights if ".q_proj." in n]:
        q, k_name, v_name = weights.pop(name), name.replace("q_proj", "k_proj"), name.replace("q_proj", "v_proj")
        if v_name not in weights:
            raise ValueError(f"{name}: SGLang stacks q/k/v and needs {v_name}")
        v = weights.pop(v_name)
        k = weights.pop(k_name) if k_name in weights else torch.zeros_like(v)
        weights[name.replace("q_proj", "qkv_proj")] = torch.cat((q, k, v), 0)
    for name in [n for n in weights if ".gate_proj." in n]:
        gate, up_name = weights.pop(name), name.replace("gate_proj", "up_proj")
        up = weights.pop(up_name) if up_name in weights else torch.zeros_like(gate)
        weights[name.replace("gate_proj", "gate_up_proj")] = torch.cat((gate, up), 0)


def delta_weights(adapter: SGLangAdapter, out_features: dict[str, int]) -> dict[str, torch.Tensor]:
    """`{HF linear name: scaling · B A}` as SGLang's kernels apply the stacked buffers (per slice of q/k/v, gate/up).

    Args:
        adapter: from `read_like_sglang`.
        out_features: output features of each HF linear name (to cut the stacked B).

    Returns:
        `{name: [out, in]}` float32; a stacked member the adapter lacks (a zero block) is included as zeros.
    """
    deltas = {}
    r = adapter.rank
    for weights in adapter.weights.values():
        for name, a in weights.items():
            if ".lora_A." not in name:
                continue
            b = weights[name.replace(".lora_A.", ".lora_B.")]
            module = name.removeprefix("base_model.model.").removesuffix(".lora_A.weight")
            leaf = module.split(".")[-1]
            parts = [(module, None)] if leaf not in _STACKED else [
                (module.replace(leaf, p), i) for i, p in enumerate(_STACKED[leaf])]  # fmt: skip
            row = 0
            for hf, i in parts:
                a_i = a if i is None else a[i * r : (i + 1) * r]
                b_i = b[row : row + out_features[hf]]
                row += out_features[hf]
                deltas[hf] = adapter.scaling * (b_i @ a_i)
    return deltas
