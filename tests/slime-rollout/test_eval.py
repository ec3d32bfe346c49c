"""Eval rollouts (`slime_rollout.generation.eval`): what is reported for a dataset with no samples."""

import json
import logging
from pathlib import Path

from slime_rollout_fakes import FakeClient
from slime_rollout_fakes import rollout_args as _args

from slime_rollout.generation.rollout import generate_rollout

A = 0  # the fake client's scripted token


class PromptIdClient(FakeClient):
    async def generate(self, payload):
        return await super().generate(dict(payload, input_ids=[0]))  # every eval prompt scripted as prompt id 0


def test_a_dataset_without_samples_is_warned_about_not_dropped_silently(use_client, tmp_path, caplog):
    # Every prompt longer than --eval-max-prompt-len is dropped; its eval/<name> metric then vanished with no
    # word at the eval (a dashboard just lost the curve), while the other dataset was reported.
    long = tmp_path / "long.jsonl"
    long.write_text(json.dumps({"input": "a very long question " * 20, "label": "A"}) + "\n")
    short = tmp_path / "short.jsonl"
    short.write_text(json.dumps({"input": "q", "label": "A"}) + "\n")
    use_client(PromptIdClient({0: [A]}, lengths={0: 1}))
    args = _args(
        eval_prompt_data=["long", str(long), "short", str(short)],
        n_samples_per_eval_prompt=1,
        eval_max_response_len=1,
        eval_max_prompt_len=8,
        input_key="input",
        label_key="label",
        apply_chat_template=False,
    )
    args.hf_checkpoint = str(Path(__file__).parents[1] / "fixtures" / "qwen3-tokenizer")
    with caplog.at_level(logging.WARNING, logger="slime_rollout.generation.eval"):
        out = generate_rollout(args, 7, None, evaluation=True)
    assert out.data["long"]["samples"] == [] and "eval/long" not in out.metrics
    assert "eval/short" in out.metrics
    (record,) = [r for r in caplog.records if r.name == "slime_rollout.generation.eval"]
    assert record.getMessage() == (
        f"eval 7: dataset long has no samples ({long}: every prompt was dropped, see the warning above, or the file "
        "has no rows); it has no eval/long metric this time"
    )
