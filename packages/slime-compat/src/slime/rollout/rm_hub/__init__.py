"""`slime.rollout.rm_hub`: reward functions (original module path).

`async_rm(args, sample)` / `batched_async_rm(args, samples)` are the run's reward dispatch (`--rm-type`,
`--custom-rm-path`, `metadata["rm_type"]`, `boxed_` prefixes, `remote_rm`); the graders are re-exported
under the original names from the submodules.
"""

from slime.rollout.rm_hub.deepscaler import get_deepscaler_rule_based_reward
from slime.rollout.rm_hub.f1 import f1_score
from slime.rollout.rm_hub.gpqa import compute_gpqa_reward
from slime.rollout.rm_hub.math_dapo_utils import compute_score as compute_score_dapo
from slime.rollout.rm_hub.math_utils import extract_answer as extract_boxed_answer
from slime.rollout.rm_hub.math_utils import grade_answer_verl
from slime_core.sample import Sample
from slime_rollout.rewards import async_rm, batched_async_rm
from slime_rollout.rewards.remote import remote_reward

__all__ = [
    "async_rm",
    "batched_async_rm",
    "compute_gpqa_reward",
    "compute_score_dapo",
    "extract_boxed_answer",
    "f1_score",
    "get_deepscaler_rule_based_reward",
    "grade_answer_verl",
    "remote_rm",
]


async def remote_rm(args: object, sample: Sample, max_retries: int = 10) -> object:
    """The reward of `sample` from the reward model at `args.rm_url` (the original's `remote_rm`).

    POSTs `{"prompt", "response", "label"}` and returns the reply JSON, with retries and backoff
    (`slime_rollout.rewards.remote.remote_reward`).

    Raises:
        ValueError: `--rm-url` is not set.
        httpx.HTTPError | TimeoutError: the last attempt's error.
    """
    payload = {"prompt": sample.prompt, "response": sample.response, "label": sample.label}
    return await remote_reward(getattr(args, "rm_url", None) or "", payload, max_retries=max_retries)
