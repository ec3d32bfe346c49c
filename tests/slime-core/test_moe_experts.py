"""`slime_core.moe_experts` on hand-made tensors: gate rows first, then up rows; down whole; fuse and split invert."""

import torch

from slime_core.moe_experts import fuse_experts, split_experts

P = "model.layers.0.mlp.experts"


def test_fused_layout_by_hand():
    # Expert e's matrices hold 10·e + {1: gate, 2: up, 3: down}: every block is recognizable after fusing.
    ckpt = {f"{P}.{e}.{proj}.weight": torch.full((2, 3) if proj != "down_proj" else (3, 2), 10.0 * e + k)
            for e in range(2) for k, proj in ((1, "gate_proj"), (2, "up_proj"), (3, "down_proj"))}  # fmt: skip
    ckpt["model.norm.weight"] = torch.ones(3)
    fused = fuse_experts(ckpt, {f"{P}.gate_up_proj", f"{P}.down_proj", "model.norm.weight"})
    assert fused[f"{P}.gate_up_proj"].shape == (2, 4, 3) and fused[f"{P}.down_proj"].shape == (2, 3, 2)
    assert fused[f"{P}.gate_up_proj"][:, :, 0].tolist() == [[1, 1, 2, 2], [11, 11, 12, 12]]
    assert fused[f"{P}.down_proj"][:, 0, 0].tolist() == [3, 13]
    back = dict(kv for name, t in fused.items() for kv in split_experts(name, t))
    assert back.keys() == ckpt.keys() and all(torch.equal(back[k], ckpt[k]) for k in ckpt)
