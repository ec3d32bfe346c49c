"""Packed variable-length micro-batches and the response log-prob forward pass.

A micro-batch is one row of concatenated sequences (no padding); `position_ids` restart at 0 at every
sequence start. Hugging Face models (transformers >= 5) then keep attention inside each sequence: flash
attention derives `cu_seqlens` from the position ids, sdpa/eager build a block-diagonal causal mask
(`transformers.masking_utils.find_packed_sequence_indices`), provided `attention_mask` is None and no KV cache
is passed.

With the attention implementations of `attention.py` (`slime_varlen`, `slime_flex`) no mask is built at all:
the row's `cu_seqlens` (or flex `BlockMask`) are computed once per micro-batch here and passed down to every
attention call. Under context parallelism (`context_parallel.py`) each rank runs the decoder on its slice of the
row and the response log-probs are all-gathered over the CP group.

Vision-language models (`vision.py`) pack the same way; the row also carries its samples' images and 4-row
position ids (text positions for the attention, then the 3-D rotary positions).

Log-probs are computed only at response positions: the decoder's final hidden states are gathered at the
positions that predict response tokens, then the head of `logprob_head.py` (`lm_head` + fp32 log-softmax, chunk
by chunk, recomputed in backward) runs over those tokens, so full `[S, V]` logits never exist.

Legend: `S` = packed length of a micro-batch, `R` = response tokens in it, `H` = hidden size, `V` = vocab.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import register_fsdp_forward_method

from slime_core.algorithms import KeptTokens
from slime_core.host_to_device import to_device_many
from slime_train_fsdp.attention import packed_attention_kwargs
from slime_train_fsdp.context_parallel import gather_response_values, shard_row
from slime_train_fsdp.logprob_head import DEFAULT_CPU_HEAD, head_log_probs
from slime_train_fsdp.true_on_policy import mirrored_response_forward
from slime_train_fsdp.vision import (
    dummy_vision_inputs,
    install_placeholder_guard,
    pack_vision_inputs,
    vision_tower_anchor,
)

__all__ = [
    "ForwardOptions",
    "PackedMicroBatch",
    "forward_options",
    "install_response_forward",
    "output_weight",
    "pack_micro_batch",
    "response_log_probs",
    "set_forward_options",
    "split_by_lengths",
]

_FORWARD_METHOD = "slime_response_forward"
_OPTIONS_ATTR = "slime_forward_options"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ForwardOptions:
    """How the installed response forward runs (chosen once, when the model is built).

    Attributes:
        head: `--log-probs-head`, a key of `logprob_head.HEADS`.
        compile_head: the `fused` head's elementwise functions run under `torch.compile` on CUDA (the decoder
            layers' `--fsdp-compile-layers`); per model, so two models in one process each keep their own.
        cp_group: the context-parallel group of this rank, or None without context parallelism.
        vision_language: the model has a vision tower (`model.model.visual`) that every forward must run.
        true_on_policy: `--true-on-policy-mode`: the row runs `true_on_policy.mirrored_response_forward` instead.
    """

    head: str = DEFAULT_CPU_HEAD
    compile_head: bool = False
    cp_group: dist.ProcessGroup | None = None
    vision_language: bool = False
    true_on_policy: bool = False

    @property
    def head_in_use(self) -> str:
        """The log-prob head every forward runs, for logs: `--true-on-policy-mode`'s own replaces `head`."""
        # The mirrored forward ignores `head` (and a call's `head=`): it runs SGLang's bf16 lm_head + log-softmax.
        return "true-on-policy (SGLang's bf16 lm_head)" if self.true_on_policy else self.head


@dataclasses.dataclass(kw_only=True, slots=True)
class PackedMicroBatch:
    """One packed micro-batch.

    Attributes:
        input_ids: `[1, S]` int64 concatenated prompt+response tokens.
        position_ids: `[1, S]` int64, restarting at 0 per sequence; for vision-language models `[4, 1, S]`: that
            row, then the 3-D rotary positions (temporal, height, width) of each sequence.
        predict_index: `[R]` int64 positions in the row whose logits predict a response token.
        targets: `[R]` int64 the response tokens predicted there.
        sample_ids: local sample positions (indices into the `RolloutBatch` lists), in packing order.
        response_lengths: `L_i` of each packed sample, in packing order.
        seq_lengths: `T_i` of each packed sample, in packing order (sum `S`): the row's sequence boundaries.
        vision: the packed samples' images (`pixel_values` `[P, C*T*p*p]`, `image_grid_thw` `[num_images, 3]`,
            in packing order), or None when none has any.
        vision_positions: `[1, S]` bool, the prompt positions (where image tokens are images; in responses they
            are text), for vision-language models; else None.
        kept: top-p replay sets of the `R` response positions (`--rollout-top-p < 1`), or None.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    predict_index: torch.Tensor
    targets: torch.Tensor
    sample_ids: list[int]
    response_lengths: list[int]
    seq_lengths: list[int] = dataclasses.field(default_factory=list)
    vision: dict[str, torch.Tensor] | None = None
    vision_positions: torch.Tensor | None = None
    kept: KeptTokens | None = None


MropeFn = Callable[[torch.Tensor, torch.Tensor | None, int], torch.Tensor]
"""`mrope(tokens [T_i], image_grid_thw or None, prompt_length) -> [3, T_i]` rotary positions (`vision.py`)."""


def pack_micro_batch(
    tokens: list[torch.Tensor],
    response_lengths: list[int],
    sample_ids: list[int],
    device: torch.device,
    kept: KeptTokens | None = None,
    *,
    multimodal: Sequence[dict[str, torch.Tensor] | None] | None = None,
    mrope: MropeFn | None = None,
) -> PackedMicroBatch:
    """Concatenates the given samples into one row.

    An empty `sample_ids` gives a one-token dummy row with `R = 0` (every rank must still run forward and
    backward so that FSDP collectives line up).

    Args:
        tokens: all samples' `[T_i]` int64 token tensors.
        response_lengths: all samples' `L_i`.
        sample_ids: which samples to pack.
        device: where to put the tensors.
        kept: top-p replay sets of the packed samples' response positions, in `sample_ids` order
            (`RolloutBatch.kept_tokens(sample_ids)`), or None.
        multimodal: all samples' vision tensors (`RolloutBatch.multimodal_train_inputs`), or None.
        mrope: for a vision-language model, its per-sequence 3-D rotary positions; the row then gets `[4, 1, S]`
            position ids.

    Returns:
        The packed micro-batch.

    Raises:
        ValueError: when a response length is not in `[0, T_i - 1]`, or a sample has images but no `mrope` is
            given (a text-only model).
    """
    ids, pos, predict, targets = [], [], [], []
    offset = 0
    for i in sample_ids:
        tok = tokens[i].long().reshape(-1)
        total, resp = int(tok.numel()), int(response_lengths[i])
        if not 0 <= resp <= total - 1:
            raise ValueError(f"sample {i}: response_length {resp} must be in [0, {total - 1}] (total {total})")
        ids.append(tok)
        pos.append(torch.arange(total))
        # Logits at position p predict token p + 1: response tokens [T-L, T) come from positions [T-L-1, T-1).
        predict.append(torch.arange(offset + total - resp - 1, offset + total - 1))
        targets.append(tok[total - resp :])
        offset += total
    if not sample_ids:
        ids, pos = [torch.zeros(1, dtype=torch.long)], [torch.zeros(1, dtype=torch.long)]
        predict, targets = [torch.zeros(0, dtype=torch.long)], [torch.zeros(0, dtype=torch.long)]
    mm = [multimodal[i] for i in sample_ids] if multimodal is not None else []
    vision = pack_vision_inputs(mm, device)
    if vision is not None and mrope is None:
        raise ValueError("a sample has images (multimodal_train_inputs) but the model is not a vision-language model")
    position_ids = torch.cat(pos).unsqueeze(0)  # [1, S]
    vision_positions = None
    if mrope is not None:
        prompts = [int(ids[k].numel()) - int(response_lengths[i]) for k, i in enumerate(sample_ids)]
        rope = [mrope(ids[k], (mm[k] or {}).get("image_grid_thw"), prompts[k]) for k in range(len(sample_ids))]
        rope_3S = torch.cat(rope, dim=1) if rope else torch.zeros(3, 1, dtype=torch.long)
        position_ids = torch.cat([position_ids, rope_3S]).unsqueeze(1)  # [4, 1, S]
        in_prompt = [torch.arange(int(t.numel())) < n for t, n in zip(ids, prompts or [1], strict=True)]
        vision_positions = torch.cat(in_prompt).unsqueeze(0)  # [1, S]
    # One non-blocking copy per dtype from pinned memory: four blocking `.to(device)` copies per micro-batch made
    # the host wait for the previous micro-batch's backward before it could queue this forward (issue 26).
    row = [torch.cat(ids).unsqueeze(0), position_ids, torch.cat(predict), torch.cat(targets)]
    if vision_positions is not None:
        row.append(vision_positions)
    moved = to_device_many(row, device)
    return PackedMicroBatch(
        input_ids=moved[0],
        position_ids=moved[1],
        predict_index=moved[2],
        targets=moved[3],
        sample_ids=list(sample_ids),
        response_lengths=[int(response_lengths[i]) for i in sample_ids],
        seq_lengths=[int(t.numel()) for t in ids],
        vision=vision,
        vision_positions=moved[4] if vision_positions is not None else None,
        kept=None if kept is None or not sample_ids else kept.to(device),
    )


def split_by_lengths(values: torch.Tensor, lengths: list[int]) -> list[torch.Tensor]:
    """Splits a `[R]` tensor into per-sample `[L_i]` views."""
    return list(torch.split(values, lengths)) if lengths else []


def _response_forward(
    self: nn.Module,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    predict_index: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk_size: int,
    with_entropy: bool,
    seq_lengths: list[int] | None = None,
    head: str | None = None,
    vision: dict[str, torch.Tensor] | None = None,
    vision_positions: torch.Tensor | None = None,
    kept: KeptTokens | None = None,
    response_lengths: list[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Forward of a packed row: response log-probs `[R]` fp32, entropy `[R]` (or `[0]`), and an anchor.

    The anchor is a zero scalar that depends on every parameter; adding it to the loss keeps backward (and
    hence FSDP's reduce-scatters) identical on all ranks, also for empty micro-batches. A vision-language model
    runs its vision tower on the row's images, or on a dummy image when the row has none (`vision.py`).
    """
    opts: ForwardOptions = getattr(self, _OPTIONS_ATTR)
    if opts.true_on_policy:  # SGLang's op order and kernels (no CP, no vision: refused by the config)
        lengths = list(seq_lengths) if seq_lengths else [int(input_ids.shape[-1])]
        return mirrored_response_forward(self, input_ids, position_ids, predict_index, targets, temperature,
                                         with_entropy, lengths, chunk_size)  # fmt: skip
    visual = getattr(self.model, "visual", None) if opts.vision_language else None
    vision_kwargs: dict[str, torch.Tensor] = {}
    if visual is not None:
        visual.slime_outputs = []
        self.model.slime_vision_positions = vision_positions
        if vision is None:
            dummy = dummy_vision_inputs(self.config.vision_config, input_ids.device, visual.dtype)
            visual(dummy["pixel_values"], grid_thw=dummy["grid_thw"])
        else:
            vision_kwargs = dict(vision)
    lengths = list(seq_lengths) if seq_lengths else [int(input_ids.shape[-1])]
    group, shard = opts.cp_group, None
    if group is not None:
        shard = shard_row(input_ids, position_ids, predict_index, targets, lengths, dist.get_rank(group),
                          dist.get_world_size(group), response_lengths)  # fmt: skip
        input_ids, position_ids, predict_index, targets = (shard.input_ids, shard.position_ids,
                                                           shard.predict_index, shard.targets)  # fmt: skip
        lengths = shard.seq_lengths
        if kept is not None:  # this rank scores a contiguous run of the response positions
            first = sum(shard.counts[: dist.get_rank(group)])
            kept = kept.slice_rows(first, first + int(targets.numel()))
    attn_kwargs = packed_attention_kwargs(lengths, input_ids.device, self.config._attn_implementation)
    if group is not None:
        attn_kwargs["slime_cp_group"] = group
    out = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False, **vision_kwargs, **attn_kwargs)
    hidden = out.last_hidden_state[0]  # [S, H] (this rank's slice under CP)
    weight = output_weight(self)  # [V, H], unsharded inside this FSDP forward
    # One element of each is enough to connect every parameter; a full bf16 sum could overflow to inf.
    anchor = (hidden[:1, :1].float().sum() + weight[:1, :1].float().sum()) * 0.0
    if visual is not None:
        anchor = anchor + vision_tower_anchor(visual.slime_outputs).to(anchor.device)
        visual.slime_outputs = []
        self.model.slime_vision_positions = None
    h_resp = hidden.index_select(0, predict_index)  # [R, H]
    logp, entropy = head_log_probs(h_resp, weight, targets, temperature=temperature, chunk_size=chunk_size,
                                   with_entropy=with_entropy, head=head or opts.head, kept=kept,
                                   compiled=opts.compile_head)  # fmt: skip
    if shard is not None:
        logp = gather_response_values(logp, shard.counts, group)
        if with_entropy:
            entropy = gather_response_values(entropy, shard.counts, group)
    return logp, entropy, anchor


def output_weight(model: nn.Module) -> torch.Tensor:
    """The `[V, H]` output-layer weight the model's own forward applies, for the log-prob head.

    A plain `lm_head` gives its weight. One that `--lora-target-modules` wrapped in peft's `lora.Linear` gives
    `W + (alpha/r)·B A` summed over its active adapters (differentiable in `A` and `B`): the wrapper's `.weight`
    is only the frozen base `W`, with which the head would ignore the adapter and never train it.

    Raises:
        ValueError: a wrapped `lm_head` with DoRA or a dropout, which no merged weight expresses (slime's
            `inject_lora` uses neither).
    """
    out = model.get_output_embeddings()
    base = getattr(out, "base_layer", None)
    if base is None:
        return out.weight
    weight = base.weight
    for name in out.active_adapters:
        if name not in out.lora_A:
            continue
        if out.use_dora.get(name) or not isinstance(out.lora_dropout[name], nn.Identity):
            raise ValueError(f"lm_head adapter {name!r}: DoRA or LoRA dropout on the output layer is not supported")
        delta = out.lora_B[name].weight @ out.lora_A[name].weight  # [V, r] @ [r, H]
        weight = weight + delta.to(weight.dtype) * out.scaling[name]
    return weight


def forward_options(model: nn.Module) -> ForwardOptions:
    """The `ForwardOptions` the installed response forward of `model` runs with (`install_response_forward`)."""
    return getattr(model, _OPTIONS_ATTR)


def set_forward_options(model: nn.Module, options: ForwardOptions) -> None:
    """Replaces the options of `model`'s installed response forward, which reads them on every call."""
    setattr(model, _OPTIONS_ATTR, options)


def install_response_forward(model: nn.Module, options: ForwardOptions | None = None) -> None:
    """Adds `model.slime_response_forward(...)` and registers it as an FSDP forward method.

    Registration makes FSDP all-gather the root unit's parameters (embeddings, final norm, `lm_head`) around
    the call and hook its backward, exactly as for `model.forward`.

    Args:
        model: the sharded causal LM.
        options: how to run; when None, what `build_fsdp_model` attached to the model (`model.slime_forward_options`)
            or else the defaults (exact `fp32` head, no context parallelism).
    """
    if options is not None or not hasattr(model, _OPTIONS_ATTR):
        setattr(model, _OPTIONS_ATTR, options or ForwardOptions())
    setattr(model, _FORWARD_METHOD, types.MethodType(_response_forward, model))
    register_fsdp_forward_method(model, _FORWARD_METHOD)
    visual = getattr(getattr(model, "model", None), "visual", None)
    if getattr(model, _OPTIONS_ATTR).vision_language and visual is not None and not hasattr(visual, "slime_outputs"):
        # The forward reads what the vision tower returned (for the loss anchor); a hook sees it whoever calls it.
        visual.slime_outputs = []
        visual.register_forward_hook(lambda module, args, output: module.slime_outputs.append(output))
        install_placeholder_guard(model.model)


def response_log_probs(
    model: nn.Module,
    mb: PackedMicroBatch,
    *,
    temperature: float,
    chunk_size: int,
    with_entropy: bool = False,
    head: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Runs the installed forward on a packed micro-batch.

    Args:
        model: sharded causal LM prepared by `install_response_forward`.
        mb: the packed micro-batch.
        temperature: `--rollout-temperature`; logits are divided by it before the softmax.
        chunk_size: response tokens per `lm_head` chunk (> 0).
        with_entropy: also return the per-token entropy.
        head: `--log-probs-head` for this call; None uses the model's `ForwardOptions.head`.

    Returns:
        (log_probs `[R]` fp32, entropy `[R]` fp32 or `[0]`, anchor scalar 0 connected to every parameter); under
        context parallelism the full micro-batch's values on every rank of the CP group.
    """
    fn = getattr(model, _FORWARD_METHOD)
    return fn(mb.input_ids, mb.position_ids, mb.predict_index, mb.targets, temperature, chunk_size, with_entropy,
              mb.seq_lengths, head, mb.vision, mb.vision_positions, mb.kept, mb.response_lengths)  # fmt: skip
