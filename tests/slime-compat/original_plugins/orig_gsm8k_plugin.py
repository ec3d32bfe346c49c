"""A plugin written for the original slime (THUDM/slime), kept exactly as its author would write it there.

Original imports and signatures only: a custom multi-turn generate function that posts to the router with
`slime.utils.http_utils.post`, reads `GenerateState(args).tokenizer`, appends the model's tokens with
`sample.append_response_tokens(args, tokens=..., log_probs=..., meta_info=...)` and a masked observation
turn, and sets an attribute of its own on the sample; a custom reward; a dynamic-sampling filter.
"""

from slime.rollout.filter_hub.base_types import DynamicFilterOutput
from slime.rollout.rm_hub.math_utils import grade_answer_verl
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

OBSERVATION = "\nObservation: keep going.\n"


async def generate(args, sample: Sample, sampling_params) -> Sample:
    state = GenerateState(args)
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"

    prompt_ids = state.tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    sample.tokens = list(prompt_ids)
    sample.rollout_top_p_token_ids = None
    sample.rollout_top_p_token_offsets = None
    half = dict(sampling_params, max_new_tokens=max(1, sampling_params["max_new_tokens"] // 2))

    for turn in range(2):
        payload = {"input_ids": sample.tokens, "sampling_params": half, "return_logprob": True}
        if turn == 0:
            payload = {"text": sample.prompt, "sampling_params": half, "return_logprob": True}
        output = await post(url, payload)
        if output["meta_info"]["finish_reason"]["type"] == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        token_ids = [item[1] for item in output["meta_info"]["output_token_logprobs"]]
        log_probs = [item[0] for item in output["meta_info"]["output_token_logprobs"]]
        sample.append_response_tokens(
            args, tokens=token_ids, log_probs=log_probs, trainable=True, meta_info=output["meta_info"]
        )
        sample.response += output["text"]
        if turn == 0:
            obs_ids = state.tokenizer(OBSERVATION, add_special_tokens=False)["input_ids"]
            sample.append_response_tokens(args, tokens=obs_ids, trainable=False)
            sample.response += OBSERVATION

    sample.payload_text = sample.prompt + sample.response
    return sample


async def reward_func(args, sample: Sample, **kwargs):
    if grade_answer_verl(sample.response, sample.label):
        return 1.0
    # A shaped reward so that groups differ (the filter below keeps only groups whose rewards differ).
    return 0.25 * (sample.tokens[-1] % 3)


def keep_diverse_groups(args, samples: list[Sample], **kwargs):
    rewards = [sample.get_reward_value(args) for sample in samples]
    keep = max(rewards) > min(rewards)
    return DynamicFilterOutput(keep=keep, reason=None if keep else "same_reward")
