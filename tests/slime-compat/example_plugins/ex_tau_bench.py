"""Stand-in for the original's tau-bench example (THUDM/slime, examples/tau-bench/generate_with_tau.py), written for
these tests.

The example's prompt is a task number (`--input-key index`, read with `int(sample.prompt)`), and its generate
function returns a NEW `Sample` built from the agent's result, with `status` given as a string ("completed",
"truncated") and no group index or rollout log-probs. Here the "agent" alternates success and truncation.
"""

from slime.utils.types import Sample

CALLS = {"n": 0}


async def generate(args, sample: Sample, sampling_params: dict) -> Sample:
    assert not args.partial_rollout, "partial rollout is not supported here"
    task_index = int(sample.prompt)
    CALLS["n"] += 1
    done = CALLS["n"] % 2 == 1
    result = Sample(index=task_index, prompt=sample.prompt, tokens=[7, 8, 9, 10, 11, 12], response="ok",
                    reward=float(done), loss_mask=[1, 1, 0, 1], status="completed" if done else "truncated",
                    metadata={"task": task_index})  # fmt: skip
    result.response_length = 4
    return result
