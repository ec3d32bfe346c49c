"""The reference engine's answer to `return_routed_experts` (SGLang's `--enable-return-routed-experts`).

SGLang captures each MoE layer's top-k expert ids while it runs a request and returns, for a finished request,
the rows of tokens `[routed_experts_start_len, seqlen - 1)` (`seqlen` = prompt + output ids: the last output token
is never run) as `meta_info["routed_experts"]`: base64 of int32 `[rows, num_hidden_layers, num_experts_per_tok]`,
zeros in dense layers (sglang 0.5.16 `srt/state_capturer/base.py::get_topk`, `detokenizer_manager.py`).

Here the routes come from one un-batched forward over those tokens with a hook on every router
(`model.model.layers[i].mlp.gate`, HF's `*TopKRouter`, whose third output is the top-k ids): the ids HF's router
picks for them. The generation itself ran them batched with a KV cache; the two agree up to floating-point ties.
"""

from __future__ import annotations

import torch
from torch import nn

from slime_core.routing_replay import encode_routed_experts, find_routers

__all__ = ["RouteCapture"]


class RouteCapture:
    """Router hooks on one served model.

    Args:
        model: the HF causal LM the engine serves.

    Raises:
        ValueError: the model has no MoE router (SGLang cannot start with `--enable-return-routed-experts` on a
            dense model either: its capturer needs `num_experts_per_tok`).
    """

    def __init__(self, model: nn.Module) -> None:
        config = model.config.get_text_config()
        routers = find_routers(model)
        if not routers or not getattr(config, "num_experts_per_tok", None):
            raise ValueError(
                f"--enable-return-routed-experts: {type(model).__name__} has no MoE router (a dense model)"
            )
        self.model = model
        self.num_layers = int(config.num_hidden_layers)
        self.topk = int(config.num_experts_per_tok)
        self._rows: dict[int, torch.Tensor] | None = None
        for i, gate in routers.items():
            gate.register_forward_hook(self._hook(i))

    def _hook(self, layer: int):
        def hook(module: nn.Module, args, output):  # noqa: ANN001
            if self._rows is not None:  # only inside `routes`; generation forwards pass through
                self._rows[layer] = output[2].detach().to(device="cpu", dtype=torch.int32)

        return hook

    @torch.inference_mode()
    def routes(self, token_ids: list[int], start_len: int = 0) -> torch.Tensor:
        """The routes of `token_ids[start_len : len - 1]` (the tokens a request ran), `[rows, L, K]` int32.

        Call with the model's lock held (a weight update must not land mid-forward).
        """
        run = token_ids[:-1]
        rows = max(0, len(run) - start_len)
        out = torch.zeros((rows, self.num_layers, self.topk), dtype=torch.int32)
        if not run or rows == 0:
            return out
        self._rows = {}
        try:
            ids = torch.tensor([run], dtype=torch.long, device=self.model.device)
            self.model(input_ids=ids, use_cache=False, logits_to_keep=1)
            for layer, ids_SK in self._rows.items():
                out[:, layer] = ids_SK[start_len:]
        finally:
            self._rows = None
        return out

    def encoded(self, token_ids: list[int], start_len: int = 0) -> str:
        """`meta_info["routed_experts"]` for a request that ran `token_ids` (prompt + output ids)."""
        return encode_routed_experts(self.routes(token_ids, start_len))
