"""Samples of one rollout -> per-DP-rank `RolloutBatch`es (rewards, masks, denominators, schedule).

`build_rollout_batches` is the entry point; `postprocess_rewards` and `loss_denominators` are the
pieces it is made of, public so that dumps, metrics and tests can use them on their own.
Behaviour follows the original slime `RolloutManager._post_process_rewards` /
`_convert_samples_to_train_data` / `_split_train_data_by_dp`.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence

import torch

from slime_core.batch import RolloutBatch
from slime_core.config import SlimeArgs
from slime_core.reward_postprocess import postprocess_rewards, reward_groups
from slime_core.routing_replay import validate_routes
from slime_core.sample import Sample, Status
from slime_core.scheduling import RESPONSE_LENGTH_HINT, build_schedule

__all__ = [
    "build_rollout_batches",
    "check_finite_log_probs",
    "loss_denominators",
    "postprocess_rewards",
    "reward_groups",
    "rollout_keys",
    "sorted_by_index",
]

logger = logging.getLogger(__name__)

# An SFT run (`--loss-type sft_loss`) generates nothing: its samples are the dataset's conversations, which the data
# source's length limit bounds (measured as trained), so that flag is what keeps them under the token budget.
_SFT_LENGTH_HINT = "drop the longer conversations with --rollout-max-prompt-len"


def rollout_keys(samples: Sequence[Sample]) -> list[Hashable]:
    """Rollout id per sample; a sample without one gets a unique key that cannot collide with real ids."""
    return [s.rollout_id if s.rollout_id is not None else ("__unique__", pos) for pos, s in enumerate(samples)]


def _loss_mask(sample: Sample) -> list[int]:
    """The sample's training mask: its `loss_mask` (all ones if unset), zeros if `remove_sample`."""
    mask = [1] * sample.response_length if sample.loss_mask is None else [int(m) for m in sample.loss_mask]
    if len(mask) != sample.response_length:
        raise ValueError(
            f"sample {sample.index}: len(loss_mask)={len(mask)} != response_length={sample.response_length}"
        )
    if sample.remove_sample:
        mask = [0] * len(mask)
    return mask


def loss_denominators(samples: Sequence[Sample]) -> list[float]:
    """Per-rollout token-mean loss denominators.

    For each sample, the summed training mask (see `remove_sample`) of all samples sharing its
    `rollout_id` (a sample without one is its own rollout), clamped to at least 1. With one sample per
    rollout this is the classic per-sample token mean; siblings that fan out from one rollout
    execution share one denominator, so the rollout counts once (slime `rollout_mask_sums`).

    Args:
        samples: the samples.

    Returns:
        N floats >= 1.
    """
    keys = rollout_keys(samples)
    totals: dict[Hashable, int] = {}
    sums = [sum(_loss_mask(s)) for s in samples]
    for k, m in zip(keys, sums, strict=True):
        totals[k] = totals.get(k, 0) + m
    return [float(max(totals[k], 1)) for k in keys]


def _teacher_log_probs(cfg: SlimeArgs, samples: Sequence[Sample]) -> list[torch.Tensor] | None:
    """Each sample's OPD teacher log-probs `[L_i]` float32, or None when no sample carries them.

    Raises:
        ValueError: some samples carry them and some do not, `--opd-type sglang` left a sample without them, or one
            holds a NaN/infinity (naming the sample and response position).
    """
    have = [s.teacher_log_probs is not None for s in samples]
    if not any(have) and not (cfg.use_opd and cfg.opd_type == "sglang"):
        return None
    if not all(have):
        missing = [s.index for s, h in zip(samples, have, strict=True) if not h]
        raise ValueError(
            f"samples {missing[:5]} have no teacher_log_probs ({sum(have)} of {len(samples)} do): with --use-opd "
            "--opd-type sglang every sample needs them (from --rm-url, or set by --custom-reward-post-process-path)"
        )
    out = [torch.as_tensor(s.teacher_log_probs, dtype=torch.float32).reshape(-1).clone() for s in samples]
    # The built-in scoring refuses a non-finite teacher log-prob (`slime_rollout.generation.opd`); one set by a reward
    # post-process or rollout plugin reached the advantages as `a - coef * (student - teacher)`: NaN or infinite
    # advantages, and (whitened, or times a 0 loss mask) a NaN loss and gradients, naming nothing.
    for sample, values in zip(samples, out, strict=True):
        bad = ~torch.isfinite(values)
        if bool(bad.any()):
            position = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"sample {sample.index}: teacher_log_probs[{position}] is {float(values[position])}, not a finite "
                f"log-prob ({int(bad.sum())} of {values.numel()} are not); the function that sets teacher_log_probs "
                "(--custom-reward-post-process-path, or a custom rollout or generate function) must give a finite "
                "natural-log probability for every response token"
            )
    return out


def sorted_by_index(samples: Sequence[Sample]) -> list[Sample]:
    """The samples in increasing `Sample.index` order (a rollout's training order); unchanged without indices.

    Raises:
        ValueError: some samples have an index and some do not.
    """
    has_index = [s.index is not None for s in samples]
    if all(has_index):
        return sorted(samples, key=lambda s: s.index)  # type: ignore[arg-type, return-value]
    if any(has_index):
        raise ValueError("some samples have an index and some do not; set Sample.index on all of them")
    return list(samples)


_warned_no_top_p_sets = False
_warned_unused_routes = False


def _routed_experts(cfg: SlimeArgs, samples: Sequence[Sample]) -> list[torch.Tensor] | None:
    """Each sample's engine routes `[T_i - 1, L, K]` int32 with `--use-rollout-routing-replay`, else None.

    Raises:
        ValueError: the flag is set and a sample carries no routes, or routes that do not match its tokens
            (`slime_core.routing_replay.validate_routes`).
    """
    global _warned_unused_routes
    have = [s.rollout_routed_experts is not None for s in samples]
    if not cfg.use_rollout_routing_replay:
        if any(have) and not _warned_unused_routes:
            _warned_unused_routes = True
            logger.warning(
                "%d samples carry rollout_routed_experts but --use-rollout-routing-replay is off: the trainer routes "
                "with its own router (set the flag to replay them)",
                sum(have),
            )
        return None
    if not all(have):
        missing = [s.index for s, h in zip(samples, have, strict=True) if not h]
        raise ValueError(
            f"--use-rollout-routing-replay: samples {missing[:5]} carry no rollout_routed_experts ({sum(have)} of "
            f"{len(samples)} do); the engine must run with --enable-return-routed-experts and a custom generate "
            "function must send return_routed_experts and keep meta_info.routed_experts "
            "(slime_core.reply_routes.attach_routed_experts)"
        )
    return [validate_routes(s.rollout_routed_experts, len(s.tokens), f"sample {s.index}") for s in samples]


def _top_p_tensors(cfg: SlimeArgs, samples: Sequence[Sample]):
    """Per-sample top-p replay sets as int64 tensors (all samples or none), or `(None, None)`."""
    global _warned_no_top_p_sets
    with_sets = [s.rollout_top_p_token_offsets is not None for s in samples]
    if any(with_sets) and not all(with_sets):
        missing = [s.index for s, w in zip(samples, with_sets, strict=True) if not w]
        raise ValueError(f"samples {missing[:5]} carry no top-p replay sets while others do")
    if not all(with_sets):
        if cfg.rollout_top_p < 1.0 and not _warned_no_top_p_sets:
            _warned_no_top_p_sets = True
            logger.warning(
                "--rollout-top-p %g but the engine returned no kept token ids: the trainer computes log-probs over "
                "the full distribution, not the truncated one the engine sampled from (top-p replay needs an "
                "engine that returns them, e.g. SGLang with the top-p replay patch, or the reference engine)",
                cfg.rollout_top_p,
            )
        return None, None
    ids = [torch.tensor(s.rollout_top_p_token_ids, dtype=torch.int64) for s in samples]
    offsets = [torch.tensor(s.rollout_top_p_token_offsets, dtype=torch.int64) for s in samples]
    return ids, offsets


_warned_step_count = False


def _check_step_count(cfg: SlimeArgs, num_steps: int, num_rollouts: int) -> None:
    """Warns (once per process) when a rollout trains another number of steps than `--num-steps-per-rollout`.

    A rollout function that returns another number of rollouts than `--rollout-batch-size` ×
    `--n-samples-per-prompt` (a custom one; samples fanned out of one rollout without a shared `rollout_id`) trains
    `rollouts // --global-batch-size` steps, as the original does, while the LR schedule and the `train/step` axis
    count `--num-steps-per-rollout` steps per rollout: the schedule then decays early or late, with no other sign.
    """
    global _warned_step_count
    expected = cfg.num_steps_per_rollout
    if expected is None or num_steps == expected or _warned_step_count:
        return
    _warned_step_count = True
    logger.warning(
        "this rollout has %d rollouts (--global-batch-size %d each step): %d optimizer steps, not "
        "--num-steps-per-rollout %d; the LR schedule counts --num-rollout x --num-steps-per-rollout steps "
        "(the rollout function returns another number of rollouts than --rollout-batch-size x "
        "--n-samples-per-prompt; samples fanned out of one rollout need a shared Sample.rollout_id)",
        num_rollouts,
        cfg.global_batch_size,
        num_steps,
        expected,
    )


def check_finite_log_probs(samples: Sequence[Sample], log_probs: Sequence[torch.Tensor]) -> None:
    """Checks that every `rollout_log_probs` value a sample carries is a finite number.

    The engine's replies are checked where they are parsed (`slime_rollout.generation.engine_reply`) and a generate
    function's or sample hook's samples where it hands them over (`slime_rollout.generation.plugin_values`, naming
    the plugin); samples that pass neither (a custom `--rollout-function-path`, a replayed dump) are checked here.
    A NaN or infinity would become the TIS weight, the `--use-rollout-logprobs` ratio or the reward-shaping KL
    (`--kl-coef`, which PPO's GAE and REINFORCE++ spread over the whole response, masked tokens included) and make
    the step's loss and every gradient NaN, naming nothing (the original trains on it). Non-trainable tokens carry
    0.0 (`Sample.append_response_tokens`).

    Args:
        samples: the samples, in the order of `log_probs`.
        log_probs: `[L_i]` float32 of each sample.

    Raises:
        ValueError: the first sample holding a non-finite value, with the value and its response position.
    """
    for sample, values in zip(samples, log_probs, strict=True):
        bad = ~torch.isfinite(values)
        if bool(bad.any()):
            position = int(bad.nonzero()[0, 0])
            raise ValueError(
                f"sample {sample.index}: rollout_log_probs[{position}] is {float(values[position])}, not a finite "
                f"log-prob ({int(bad.sum())} of {values.numel()} are not); a generate function that sets "
                "rollout_log_probs must give a "
                "finite natural-log probability for every trainable token and 0.0 for the others"
            )


def check_token_ids(samples: Sequence[Sample], tokens: Sequence[torch.Tensor], vocab_size: int) -> None:
    """Checks that every token id indexes the policy's embedding.

    A generate function, an env or a data source that builds `Sample.tokens` itself can put an id there that no
    engine produces (another tokenizer's, -100 as HF's ignore index, -1 as padding). The trainer's embedding then
    failed on it: on a CPU as `IndexError: index out of range in self` deep in the model, on a GPU as a device-side
    assert that poisons the CUDA context; neither named the sample.

    Args:
        samples: the samples, in the order of `tokens`.
        tokens: `[T_i]` int64 token ids of each sample.
        vocab_size: rows of the policy's token embedding.

    Raises:
        ValueError: the first sample holding an id outside `[0, vocab_size)`, with the id, its position and
            whether it is in the prompt or the response.
    """
    for sample, ids in zip(samples, tokens, strict=True):
        if ids.numel() == 0 or (int(ids.min()) >= 0 and int(ids.max()) < vocab_size):
            continue
        position = int(((ids < 0) | (ids >= vocab_size)).nonzero()[0, 0])
        part = "response" if position >= len(sample.tokens) - sample.response_length else "prompt"
        raise ValueError(
            f"sample {sample.index}: token id {int(ids[position])} at position {position} ({part}) is outside the "
            f"policy's vocabulary [0, {vocab_size}) (config.json of --hf-checkpoint); a generate function, env or "
            "data source that builds `tokens` must use the policy's tokenizer"
        )


def build_rollout_batches(
    cfg: SlimeArgs,
    samples: Sequence[Sample],
    *,
    dp_size: int,
    rewards: tuple[Sequence[float], Sequence[float]] | None = None,
    vocab_size: int | None = None,
) -> list[RolloutBatch]:
    """Turns one rollout's samples into one `RolloutBatch` per data-parallel rank.

    Steps: sort by `Sample.index`; `postprocess_rewards`; training masks (`remove_sample` zeroes);
    `loss_denominators`; tensorize once (tokens `[T_i]` int64, masks `[L_i]` float32, rollout
    log-probs `[L_i]` float32; vision tensors `Sample.multimodal_train_inputs` when any sample has them; engine
    routes `[T_i - 1, L, K]` int32 with `--use-rollout-routing-replay`);
    `scheduling.build_schedule` over total lengths and rollout ids; slice
    per rank. `raw_rewards` takes `metadata["raw_reward"]` when a sample carries it (set by reward
    shaping upstream). Samples in trailing rollouts that do not fill an optimizer step are dropped.

    Args:
        cfg: run config; reads the fields of `postprocess_rewards` plus `global_batch_size`,
            `use_dynamic_batch_size`, `max_tokens_per_gpu`, `micro_batch_size`, `balance_data`,
            `balance_by_flops` and `context_parallel_size` (1 unless `--train-backend megatron`).
        samples: the rollout's samples, any order.
        dp_size: number of data-parallel ranks.
        rewards: `(raw_rewards, rewards)` already computed by `postprocess_rewards(cfg, sorted_by_index(samples))`,
            so a `--custom-reward-post-process-path` plugin runs once per rollout (the caller also logs its
            output); None: computed here.
        vocab_size: rows of the policy's token embedding (`vocab_size` of its config.json); every token id must
            be in `[0, vocab_size)` (`check_token_ids`). None: not checked.

    Returns:
        `dp_size` batches; batch r holds rank r's samples in increasing `Sample.index` order, its
        schedule in local positions, and the global `step_sample_counts` / `step_rollout_counts` /
        `step_token_counts`.

    Raises:
        ValueError: on empty input, mixed presence of `index` or of `rollout_log_probs` (a sample without
            trainable tokens may lack them: it gets zeros), a rollout log-prob that is not finite
            (`check_finite_log_probs`), inconsistent sample lengths, missing or misaligned
            routes with `--use-rollout-routing-replay` (`_routed_experts`), a sample that sets an
            original field this version cannot train with (`Sample.unsupported_fields`), `rewards` lists whose
            lengths are not the number of samples, or any error of `postprocess_rewards` / `build_schedule`.
    """
    if not samples:
        raise ValueError("build_rollout_batches: no samples")
    ordered = sorted_by_index(samples)
    for s in ordered:
        s.validate()
        if unsupported := s.unsupported_fields():
            raise ValueError(
                f"sample {s.index} sets {', '.join(unsupported)}: not implemented in this version; leave it None"
            )
    if rewards is None:
        raw, rewards = postprocess_rewards(cfg, ordered)
    elif {len(rewards[0]), len(rewards[1])} != {len(ordered)}:
        lengths = f"{len(rewards[0])} raw rewards and {len(rewards[1])} rewards"
        raise ValueError(f"build_rollout_batches: {lengths} for {len(ordered)} samples")
    else:
        raw, rewards = list(rewards[0]), list(rewards[1])
    raw = [r if (m := s.metadata_raw_reward()) is None else m for s, r in zip(ordered, raw, strict=True)]
    masks = [_loss_mask(s) for s in ordered]
    denominators = loss_denominators(ordered)

    # A sample with no trainable token may lack rollout log-probs (only tool tokens: Sample.append_response_tokens
    # leaves them None where the original writes zeros); next to samples that carry them it gets those zeros.
    with_lp = [s.rollout_log_probs is not None or not any(m) for s, m in zip(ordered, masks, strict=True)]
    if any(s.rollout_log_probs is not None for s in ordered) and not all(with_lp):
        missing = [s.index for s, w in zip(ordered, with_lp, strict=True) if not w]
        raise ValueError(f"samples {missing[:5]} have trainable tokens but no rollout_log_probs; others have them")
    lp_lists = [s.rollout_log_probs for s in ordered]
    if any(lp is not None for lp in lp_lists):
        lp_lists = [[0.0] * s.response_length if lp is None else lp for s, lp in zip(ordered, lp_lists, strict=True)]

    top_p_ids, top_p_offsets = _top_p_tensors(cfg, ordered)
    tokens_t = [torch.tensor(s.tokens, dtype=torch.int64) for s in ordered]
    if vocab_size is not None:
        check_token_ids(ordered, tokens_t, vocab_size)
    masks_t = [torch.tensor(m, dtype=torch.float32) for m in masks]
    logp_t = None if lp_lists[0] is None else [torch.tensor(lp, dtype=torch.float32) for lp in lp_lists]
    if logp_t is not None:
        check_finite_log_probs(ordered, logp_t)
    # Vision tensors travel only when some sample has images; text-only batches keep the field None.
    with_mm = any(s.multimodal_train_inputs is not None for s in ordered)
    teacher_t = _teacher_log_probs(cfg, ordered)
    routes_t = _routed_experts(cfg, ordered)

    keys = rollout_keys(ordered)
    schedule = build_schedule(
        [len(s.tokens) for s in ordered],
        keys,
        dp_size=dp_size,
        global_batch_size=cfg.global_batch_size,
        use_dynamic_batch_size=cfg.use_dynamic_batch_size,
        max_tokens_per_gpu=cfg.max_tokens_per_gpu,
        micro_batch_size=cfg.micro_batch_size,
        balance_data=cfg.balance_data,
        balance_by_flops=cfg.balance_by_flops,
        cp_size=cfg.context_parallel_size,
        length_hint=_SFT_LENGTH_HINT if cfg.loss_type == "sft_loss" else RESPONSE_LENGTH_HINT,
    )
    _check_step_count(cfg, schedule.num_steps, len(set(keys)))
    step_sample_counts = [len(p) for p in schedule.step_positions]
    # The loss divisor: siblings of one rollout share its token-mean denominator, so the rollout counts once.
    step_rollout_counts = [len({keys[p] for p in pos}) for pos in schedule.step_positions]
    step_token_counts = [float(sum(sum(masks[p]) for p in pos)) for pos in schedule.step_positions]

    batches = []
    for rank_steps in schedule.rank_micro_batches:
        mine = sorted(p for step in rank_steps for mb in step for p in mb)
        local = {p: i for i, p in enumerate(mine)}
        batches.append(
            RolloutBatch(
                tokens=[tokens_t[p] for p in mine],
                response_lengths=[ordered[p].response_length for p in mine],
                loss_masks=[masks_t[p] for p in mine],
                rewards=[rewards[p] for p in mine],
                raw_rewards=[raw[p] for p in mine],
                loss_denominators=[denominators[p] for p in mine],
                rollout_log_probs=None if logp_t is None else [logp_t[p] for p in mine],
                rollout_top_p_token_ids=None if top_p_ids is None else [top_p_ids[p] for p in mine],
                rollout_top_p_token_offsets=None if top_p_offsets is None else [top_p_offsets[p] for p in mine],
                truncated=[int(ordered[p].status is Status.TRUNCATED) for p in mine],
                sample_indices=[ordered[p].index if ordered[p].index is not None else p for p in mine],
                micro_batches=[[[local[p] for p in mb] for mb in step] for step in rank_steps],
                step_sample_counts=list(step_sample_counts),
                step_rollout_counts=list(step_rollout_counts),
                step_token_counts=list(step_token_counts),
                metadata=[dict(ordered[p].train_metadata or {}) for p in mine],
                multimodal_train_inputs=[ordered[p].multimodal_train_inputs for p in mine] if with_mm else None,
                teacher_log_probs=None if teacher_t is None else [teacher_t[p] for p in mine],
                rollout_routed_experts=None if routes_t is None else [routes_t[p] for p in mine],
            )
        )
    return batches
