"""MoE expert weights between the checkpoint's per-expert layout and transformers' fused modules.

transformers >= 5 holds the experts of an MoE block (e.g. `Qwen3MoeExperts`) as two 3-D parameters,
`experts.gate_up_proj` `[E, 2·I, H]` (gate rows, then up rows: `forward` chunks the projection in two) and
`experts.down_proj` `[E, H, I]`, while checkpoints (and SGLang) name one matrix per expert:
`experts.{e}.gate_proj.weight` `[I, H]`, `experts.{e}.up_proj.weight` `[I, H]`, `experts.{e}.down_proj.weight`
`[H, I]`. The FSDP trainer fuses them on load (`fuse_experts`) and splits them again for export and weight sync
(`split_experts`); the reference engine writes a pushed per-expert matrix into its slice of the fused parameter
(`expert_slice`). `per_expert_name` / `fused_expert_name` parse the two spellings (the weight check maps both to
SGLang's `w13_weight` / `w2_weight`).

Legend: `E` experts, `I` expert intermediate size, `H` hidden size.
"""

from __future__ import annotations

import re
from collections.abc import Container, Iterator

import torch

__all__ = ["expert_slice", "fuse_experts", "fused_expert_name", "per_expert_name", "split_experts"]

_PER_EXPERT = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")
_FUSED = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<proj>gate_up_proj|down_proj)$")


def per_expert_name(name: str) -> tuple[str, int, str] | None:
    """`(experts prefix, expert index, projection)` of a per-expert checkpoint matrix; None for any other name.

    Example:
        >>> per_expert_name("model.layers.1.mlp.experts.3.up_proj.weight")
        ('model.layers.1.mlp.experts', 3, 'up_proj')
    """
    m = _PER_EXPERT.match(name)
    return None if m is None else (m["prefix"], int(m["e"]), m["proj"])


def fused_expert_name(name: str) -> tuple[str, str] | None:
    """`(experts prefix, projection)` of transformers' fused expert parameter (no `.weight`); None for any other name.

    Example:
        >>> fused_expert_name("model.layers.1.mlp.experts.gate_up_proj")
        ('model.layers.1.mlp.experts', 'gate_up_proj')
    """
    m = _FUSED.match(name)
    return None if m is None else (m["prefix"], m["proj"])


def fuse_experts(checkpoint: dict[str, torch.Tensor], wanted: set[str]) -> dict[str, torch.Tensor]:
    """Replaces per-expert matrices by the fused parameters the model has (`wanted` module names).

    Args:
        checkpoint: tensors by module name.
        wanted: the model's parameter names; only fused names in it are built (a model with per-expert modules
            keeps the checkpoint as it is).

    Returns:
        A new dict; other tensors pass through.

    Raises:
        ValueError: a fused parameter whose experts are not numbered `0..E-1` or lack a projection.
    """
    groups: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    out = {}
    for name, tensor in checkpoint.items():
        m = _PER_EXPERT.match(name)
        if m and f"{m['prefix']}.gate_up_proj" in wanted:
            groups.setdefault(m["prefix"], {}).setdefault(int(m["e"]), {})[m["proj"]] = tensor
        else:
            out[name] = tensor
    for prefix, experts in groups.items():
        if sorted(experts) != list(range(len(experts))) or any(len(p) != 3 for p in experts.values()):
            raise ValueError(f"{prefix}: the checkpoint's experts are incomplete ({len(experts)} found)")
        ordered = [experts[e] for e in range(len(experts))]
        out[f"{prefix}.gate_up_proj"] = torch.stack([torch.cat([p["gate_proj"], p["up_proj"]]) for p in ordered])
        out[f"{prefix}.down_proj"] = torch.stack([p["down_proj"] for p in ordered])
    return out


def split_experts(name: str, tensor: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """A fused expert parameter as per-expert checkpoint tensors (views); any other tensor unchanged."""
    m = _FUSED.match(name)
    if m is None or tensor.ndim != 3:
        yield name, tensor
        return
    for e in range(tensor.shape[0]):
        if m["proj"] == "down_proj":
            yield f"{m['prefix']}.{e}.down_proj.weight", tensor[e]
        else:
            gate, up = tensor[e].chunk(2, dim=0)
            yield f"{m['prefix']}.{e}.gate_proj.weight", gate
            yield f"{m['prefix']}.{e}.up_proj.weight", up


def expert_slice(name: str, fused_names: Container[str]) -> tuple[str, int, int | None] | None:
    """Where a per-expert checkpoint matrix lives in a fused parameter: `(fused_name, expert, half)`.

    Args:
        name: a checkpoint name such as `model.layers.0.mlp.experts.3.up_proj.weight`.
        fused_names: the model's parameter names (a state dict works).

    Returns:
        The fused parameter's name, the expert index, and which half of `gate_up_proj[expert]`'s rows the matrix
        fills (0: gate, 1: up; None for `down_proj[expert]`, filled whole); None when `name` is not per-expert or
        the model holds no fused parameter for it.
    """
    m = _PER_EXPERT.match(name)
    if m is None:
        return None
    fused = f"{m['prefix']}.{'down_proj' if m['proj'] == 'down_proj' else 'gate_up_proj'}"
    if fused not in fused_names:
        return None
    return fused, int(m["e"]), {"gate_proj": 0, "up_proj": 1, "down_proj": None}[m["proj"]]
