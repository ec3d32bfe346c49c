"""The pre-launch checks of a run whose `--rollout-function-path` is the SFT rollout (`data.sft`).

What the SFT rollout cannot serve was found only at its first rollout or eval (the original asserts there), after
Ray and the trainers started. `slime_rollout.preflight` runs these; the rows' own check is
`data.sft.conversation_problem`, run there on every row.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from slime_core.plugins import PluginError
from slime_core.registry import Problem
from slime_rollout.data.sft import generate_sft_rollout
from slime_rollout.plugins import eval_function, load_function

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs

__all__ = ["is_sft", "sft_problems"]


def is_sft(cfg: SlimeArgs) -> bool:
    """Whether `--rollout-function-path` is the SFT rollout (`slime_rollout.data.sft`, or the original's path)."""
    try:
        return load_function(cfg.rollout_function_path, flag="--rollout-function-path") is generate_sft_rollout
    except PluginError:  # a bad path is the plugin check's error
        return False


def sft_problems(cfg: SlimeArgs) -> list[Problem]:
    """What the SFT rollout cannot serve (the original asserts).

    No dataset, several samples per conversation, an eval, or prompts the data source renders into text.

    Args:
        cfg: run config of an SFT run (`is_sft`); reads `disable_rollout_global_dataset`, `n_samples_per_prompt`,
            `apply_chat_template`, `rollout_function_path` and what `plugins.eval_function` reads.

    Returns:
        The problems (errors), at most one of the first two.
    """
    if cfg.disable_rollout_global_dataset:  # every sample came with an empty prompt: "got str ''" at rollout 0
        found = [
            Problem(
                message="--disable-rollout-global-dataset with the SFT rollout: it trains on the conversations of "
                "--prompt-data; give them"
            )
        ]
    elif cfg.n_samples_per_prompt != 1:  # found after Ray and the trainers started, at the first rollout
        found = [Problem(message=f"SFT needs --n-samples-per-prompt 1, got {cfg.n_samples_per_prompt}")]
    else:
        evaluator = eval_function(cfg)
        found = []
        if evaluator is not None and evaluator[1] is generate_sft_rollout:
            # Found at the first eval otherwise: with --skip-eval-before-train, after --eval-interval rollouts.
            found.append(
                Problem(
                    message=f"--eval-prompt-data / --eval-config with the SFT rollout ({evaluator[0]}) as the eval "
                    "function: it has no eval mode; leave the eval data out, or give --eval-function-path a "
                    "generating rollout (with engines)"
                )
            )
    found += _unread_hooks(cfg, evaluator=None if found else eval_function(cfg))
    if cfg.multimodal_keys:
        # The SFT rollout tokenizes text conversations and sends no image to the trainer. The original's (its VLM
        # data processing reverted) stopped in a text model's chat template at the first rollout (Qwen3's: "'list
        # object' has no attribute 'startswith'") or trained a VL model on image placeholders without the picture.
        found.append(
            Problem(
                message=f"--multimodal-keys with --rollout-function-path {cfg.rollout_function_path}: the SFT rollout "
                "trains text conversations only (no image reaches the model); drop --multimodal-keys and "
                "--apply-chat-template"
            )
        )
    elif cfg.apply_chat_template:
        # The SFT rollout renders the conversation itself (and masks it by turn): a prompt the data source rendered
        # into text failed at the first rollout ("SFT needs a non-empty list of chat messages").
        found.append(
            Problem(
                message=f"--apply-chat-template with --rollout-function-path {cfg.rollout_function_path}: the SFT "
                "rollout renders each conversation with the chat template itself (--loss-mask-type); drop the flag"
            )
        )
    return found


# The rollout-side hooks the SFT rollout never calls (the original's neither: it tokenizes the conversations it draws
# and returns them). The first four are training-only; the last three an eval rollout with engines calls too.
_TRAINING_HOOKS = {
    "dynamic_sampling_filter_path": "--dynamic-sampling-filter-path",
    "rollout_sample_filter_path": "--rollout-sample-filter-path",
    "rollout_all_samples_process_path": "--rollout-all-samples-process-path",
    "buffer_filter_path": "--buffer-filter-path",
}
_SAMPLE_HOOKS = {
    "custom_generate_function_path": "--custom-generate-function-path",
    "custom_rm_path": "--custom-rm-path",
    "rollout_sample_hook_path": "--rollout-sample-hook-path",
}


def _unread_hooks(cfg: SlimeArgs, evaluator: tuple[str, object] | None) -> list[Problem]:
    """One error naming the hook flags an SFT run would accept and never call (they were taken without a word).

    A per-sample hook (generate, reward, sample hook) stays allowed where a generating eval function runs, which
    calls it on the eval samples.
    """
    unread = [flag for field, flag in _TRAINING_HOOKS.items() if getattr(cfg, field)]
    if evaluator is None or evaluator[1] is generate_sft_rollout:
        unread += [flag for field, flag in _SAMPLE_HOOKS.items() if getattr(cfg, field)]
    if not unread:
        return []
    return [
        Problem(
            message=f"{', '.join(unread)} with --rollout-function-path {cfg.rollout_function_path}: the SFT rollout "
            "generates nothing, so it never calls them (nor does the original's); drop them"
        )
    ]
