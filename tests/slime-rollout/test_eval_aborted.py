"""Eval samples that come back ABORTED are left out, counted and said (issue 27, plugin pass).

A generate function that marks an eval sample ABORTED (or an engine that aborted its request) left it without a
reward, and the eval failed as "sample 1 has no reward yet", naming neither the dataset nor the generate function.
"""

import logging

from slime_rollout_fakes import FakeClient
from slime_rollout_fakes import rollout_args as _args

from slime_core.sample import Status
from slime_rollout.generation.eval import eval_rollout_async

A = ord("A")


async def odd_aborted_generate(args, sample, sampling_params, evaluation=False):
    """Answers "A" (reward 1 with the fakes' reward) for even sample indices, ABORTED for odd ones."""
    if sample.index % 2:
        sample.status = Status.ABORTED
        return sample
    sample.append_response_tokens([A], log_probs=[-0.1], text="A")
    sample.status = Status.COMPLETED
    return sample


async def test_aborted_eval_samples_are_left_out_counted_and_named(use_client, tmp_path, caplog):
    use_client(FakeClient({}))
    data = tmp_path / "eval.jsonl"
    data.write_text('{"prompt": "a", "label": "A"}\n{"prompt": "b", "label": "A"}\n')
    path = f"{__name__}.odd_aborted_generate"
    args = _args(eval_prompt_data=["toy", str(data)], input_key="prompt", n_samples_per_eval_prompt=2,
                 custom_generate_function_path=path, log_passrate=True)  # fmt: skip
    with caplog.at_level(logging.WARNING, logger="slime_rollout.generation.eval"):
        out = await eval_rollout_async(args, 4)
    # Samples 0 and 2 answered (reward 1), 1 and 3 aborted: pass@k is skipped, the groups are broken.
    assert out.metrics == {"eval/toy": 1.0, "eval/toy-truncated_ratio": 0.0, "eval/toy/response_len/mean": 1.0,
                           "eval/toy-aborted_ratio": 0.5}  # fmt: skip
    assert [s.index for s in out.data["toy"]["samples"]] == [0, 2] and out.data["toy"]["rewards"] == [1.0, 1.0]
    assert (f"eval 4: dataset toy: 2 of 4 samples came back ABORTED (from --custom-generate-function-path {path}, or "
            "the engine aborted them; samples [1, 3]); they are left out of eval/toy") in caplog.text  # fmt: skip
    assert "--log-passrate: eval toy left samples out (ABORTED); pass@k skipped" in caplog.text
