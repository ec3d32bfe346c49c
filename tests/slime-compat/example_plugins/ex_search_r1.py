"""Stand-in for the original's search-r1 example (THUDM/slime, examples/search-r1/generate_with_search.py), written
for these tests.

A multi-turn generate function that posts `text` to the router, sends each `<search>` query to a retrieval server
with `post`, appends the result as an observation the loss masks out (log-prob 0.0), and a custom reward
`reward_func(args, sample, **kwargs)`: 1.0 when the last `<answer>` is one of the label's targets.
"""

import re

from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

SEARCH = {"search_url": "http://127.0.0.1:8000/retrieve", "max_turns": 3}  # the test points search_url at its server


async def generate(args, sample: Sample, sampling_params) -> Sample:
    tokenizer = GenerateState(args).tokenizer
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    sample.tokens = tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    response, ids, loss_mask, log_probs = "", [], [], []
    for _ in range(SEARCH["max_turns"]):
        output = await post(url, {"text": sample.prompt + response, "sampling_params": sampling_params,
                                  "return_logprob": True})  # fmt: skip
        finish = output["meta_info"]["finish_reason"]["type"]
        if finish == "abort":
            sample.status = Sample.Status.ABORTED
            return sample
        pairs = output["meta_info"]["output_token_logprobs"]
        response += output["text"]
        ids += [p[1] for p in pairs]
        log_probs += [p[0] for p in pairs]
        loss_mask += [1] * len(pairs)
        query = re.search(r"<search>(.*?)</search>", output["text"])
        if query is None or finish == "length":
            break
        hits = await post(SEARCH["search_url"], {"queries": [query.group(1)], "topk": 1})
        observation = f"\n\n<information>{hits['result'][0][0]['contents']}</information>\n\n"
        obs_ids = tokenizer(observation, add_special_tokens=False)["input_ids"]
        response += observation
        ids += obs_ids
        log_probs += [0.0] * len(obs_ids)
        loss_mask += [0] * len(obs_ids)
    sample.tokens += ids
    sample.response, sample.response_length = response, len(ids)
    sample.loss_mask, sample.rollout_log_probs = loss_mask, log_probs
    sample.status = Sample.Status.TRUNCATED if finish == "length" else Sample.Status.COMPLETED
    return sample


async def reward_func(args, sample: Sample, **kwargs) -> float:
    answers = re.findall(r"<answer>(.*?)</answer>", sample.response)
    return 1.0 if answers and answers[-1].strip() in sample.label["ground_truth"]["target"] else 0.0
