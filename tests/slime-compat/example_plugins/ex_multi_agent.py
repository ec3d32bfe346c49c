"""Stand-in for the original's multi-agent example (THUDM/slime, examples/multi_agent/rollout_with_multi_agents.py
and agent_system.py), written for these tests.

One generate call fans out into solver, rewriter and selector samples, with the example's moves: its settings set on
`args` with `setattr`, the agent system found with `load_function`, `deepcopy(args)`, token-id requests with `post`,
rewards from `batched_async_rm`, a reward bonus when the selector picks a right answer, and the input sample's index
stamped as the `rollout_id` of every sample it returns.
"""

import asyncio
import re
from copy import deepcopy

from transformers import AutoTokenizer

from slime.rollout.rm_hub import batched_async_rm
from slime.utils.http_utils import post
from slime.utils.misc import load_function
from slime.utils.types import Sample

SETTINGS = {"agent_system_path": "ex_multi_agent.run_agent_system", "num_parallel": 2, "right_weight": 1.2}


async def generate(args, sample: Sample, sampling_params, evaluation=False) -> list[Sample]:
    args.sampling_params = sampling_params
    args.tokenizer = AutoTokenizer.from_pretrained(args.hf_checkpoint)
    for key, value in SETTINGS.items():
        setattr(args, key, value)
    return await load_function(args.agent_system_path)(args, sample)


async def _ask(args, prompt: str) -> Sample:
    sample = deepcopy(args.sample)
    sample.prompt = prompt
    sample.tokens = args.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    payload = {"input_ids": sample.tokens, "sampling_params": args.sampling_params, "return_logprob": True}
    output = await post(url, payload)
    pairs = output["meta_info"]["output_token_logprobs"]
    sample.append_response_tokens(args, tokens=[p[1] for p in pairs], log_probs=[p[0] for p in pairs], trainable=True,
                                  meta_info=output["meta_info"])  # fmt: skip
    sample.response = output["text"]
    sample.status = Sample.Status.COMPLETED
    sample.response_content = output["text"].split("</think>")[-1].strip()  # an attribute of the plugin's own
    return sample


async def run_agent_system(args, sample: Sample) -> list[Sample]:
    args = deepcopy(args)  # generate() set attributes on the caller's args
    args.sample = sample
    n = args.num_parallel
    solvers = await asyncio.gather(*(_ask(args, f"Solve: {sample.prompt}") for _ in range(n)))
    drafts = "\n".join(s.response_content for s in solvers)
    rewriters = await asyncio.gather(*(_ask(args, f"Rewrite: {sample.prompt}\n{drafts}") for _ in range(n)))
    selector = await _ask(args, "Select one:\n" + "\n".join(s.response_content for s in rewriters))
    for s, reward in zip(solvers + rewriters, await batched_async_rm(args, solvers + rewriters), strict=True):
        s.reward = reward
    picked = int(re.search(r"Judgment: (\d+)", selector.response_content).group(1)) - 1
    selector.reward = rewriters[picked].reward
    weight = args.right_weight if selector.reward == 1 else 1.0
    everyone = [*solvers, *rewriters, selector]
    for s in everyone:
        s.reward *= weight
        s.rollout_id = sample.index
    return everyone
