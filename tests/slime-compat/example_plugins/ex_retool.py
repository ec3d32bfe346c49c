"""Stand-in for the original's retool example (THUDM/slime, examples/retool/generate_with_retool.py), written for
these tests.

A multi-turn generate function that posts token ids to the router, runs each `<tool_call>`'s code in a python3
subprocess, appends its output as a masked `<interpreter>` observation and counts the calls on the sample
(`tool_call_count`); a dict reward from `math_dapo_utils.compute_score`, read with `--reward-key score`, with the
example's tool bonus on wrong answers: `min(-0.6, score + (calls - 2) / 2 * 0.1)`.
"""

import asyncio
import json
import re
import sys

from slime.rollout.rm_hub.math_dapo_utils import compute_score
from slime.rollout.sglang_rollout import GenerateState
from slime.utils.http_utils import post
from slime.utils.types import Sample

MAX_TURNS = 3
TOOL_TIMEOUT_S = 60


async def _run_python(code: str) -> str:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", code, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), TOOL_TIMEOUT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    return out.decode()


async def generate(args, sample: Sample, sampling_params) -> Sample:
    tokenizer = GenerateState(args).tokenizer
    url = f"http://{args.sglang_router_ip}:{args.sglang_router_port}/generate"
    prompt_ids = tokenizer(sample.prompt, add_special_tokens=False)["input_ids"]
    response, ids, loss_mask, log_probs, calls = "", [], [], [], 0
    for _ in range(MAX_TURNS):
        output = await post(url, {"input_ids": prompt_ids + ids, "sampling_params": sampling_params,
                                  "return_logprob": True})  # fmt: skip
        pairs = output["meta_info"]["output_token_logprobs"]
        response += output["text"]
        ids += [p[1] for p in pairs]
        log_probs += [p[0] for p in pairs]
        loss_mask += [1] * len(pairs)
        call = re.search(r"<tool_call>\s*(\{.*\})\s*</tool_call>", output["text"], re.DOTALL)
        if call is None:
            break
        result = await _run_python(json.loads(call.group(1))["arguments"]["code"])
        observation = f"\n\n<interpreter>\nOutput:\n{result}</interpreter>\n\n"
        obs_ids = tokenizer(observation, add_special_tokens=False)["input_ids"]
        response += observation
        ids += obs_ids
        log_probs += [0.0] * len(obs_ids)
        loss_mask += [0] * len(obs_ids)
        calls += 1
    sample.tokens = prompt_ids + ids
    sample.response, sample.response_length = response, len(ids)
    sample.loss_mask, sample.rollout_log_probs = loss_mask, log_probs
    sample.tool_call_count = calls
    sample.status = Sample.Status.COMPLETED
    return sample


async def reward_func(args, sample: Sample, **kwargs) -> dict:
    result = compute_score(sample.prompt + sample.response, sample.label, strict_box_verify=True)
    if result["score"] < 0:
        result["score"] = min(-0.6, result["score"] + (sample.tool_call_count - 2) / 2 * 0.1)
    return result
