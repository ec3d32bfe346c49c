"""`slime_rollout.generation.preflight`: the synchronous rollout's flags checked against the data source it is given."""

import pytest
from slime_preflight_helpers import _cfg, _errors, _write

from slime_rollout.data.source import RolloutDataSource

BUFFERLESS = "slime.rollout.data_source.RolloutDataSource"
FILTER = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"


class KeepsItsOwn(RolloutDataSource):
    """A buffer-less source's subclass that keeps what it is handed."""

    def add_samples(self, groups):
        self.kept = groups


def _partial_problems(tmp_path, *extra):
    data = _write(tmp_path / "d.jsonl", {"prompt": "p", "label": "1"})
    return [m for m in _errors(_cfg(data, "--rm-type", "math", *extra)) if "--partial-rollout" in m]


@pytest.mark.parametrize(
    ("extra", "refused"),
    [
        (("--over-sampling-batch-size", "4"), True),
        (("--dynamic-sampling-filter-path", FILTER), True),
        ((), False),  # nothing is left over: add_samples is never called
        (("--over-sampling-batch-size", "4", "--data-source-path", f"{__name__}.KeepsItsOwn"), False),
        (("--over-sampling-batch-size", "4", "--data-source-path", "DEFAULT"), False),
        (("--over-sampling-batch-size", "4", "--rollout-function-path", "FULLY_ASYNC"), False),
    ],
)
def test_partial_rollout_into_a_bufferless_data_source_is_refused_before_the_run_only_where_it_would_fail(
    tmp_path, extra, refused
):
    # Was: accepted, then the end of rollout 0 raised "RolloutDataSource has no buffer" from add_samples.
    extra = tuple(
        {"DEFAULT": "slime.rollout.data_source.RolloutDataSourceWithBuffer",
         "FULLY_ASYNC": "slime.rollout.fully_async_rollout.generate_rollout_fully_async"}.get(x, x)
        for x in extra
    )  # fmt: skip
    if "--data-source-path" not in extra:
        extra += ("--data-source-path", BUFFERLESS)
    messages = _partial_problems(tmp_path, "--partial-rollout", *extra)
    assert len(messages) == (1 if refused else 0)
    if refused:
        assert messages[0].startswith("--partial-rollout hands each rollout's unfinished groups back to the data")
        assert f"--data-source-path {BUFFERLESS} cannot keep (it has no buffer)" in messages[0]
    assert _partial_problems(tmp_path, *extra) == []  # without --partial-rollout, nothing to refuse


def test_the_bufferless_data_source_really_refuses_the_groups_handed_back():
    # What the check foresees: the default rollout's add_samples call on this class fails.
    with pytest.raises(RuntimeError, match="has no buffer"):
        RolloutDataSource.add_samples(object.__new__(RolloutDataSource), [[]])


def _stop_problems(tmp_path, *extra):
    data = _write(tmp_path / "d.jsonl", {"prompt": "p", "label": "1"})
    return [m for m in _errors(_cfg(data, "--rm-type", "math", *extra)) if "--rollout-stop" in m]


def test_stops_that_cannot_stop_a_response_as_meant_are_refused(tmp_path):
    # Reproducer: `--rollout-stop ""` (a script's unset $STOP) was sent to every request, and SGLang finds "" in any
    # text: every response ended after one token. Stop ids below 0 or past the vocabulary were never sampled.
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen3", "vocab_size": 100}')
    assert _stop_problems(tmp_path, "--rollout-stop", "</answer>", "", "--rollout-stop-token-ids", "7") == [
        "--rollout-stop ['</answer>', '']: an empty stop string is found in any text, so the engines end every "
        "response after its first token; drop it"
    ]
    assert _stop_problems(tmp_path, "--hf-checkpoint", str(model), "--rollout-stop-token-ids", "99", "100", "-1") == [
        "--rollout-stop-token-ids [100, -1]: not token ids the model samples (0 to 99, the vocabulary of "
        "--hf-checkpoint), so they stop nothing; give the ids of the stop tokens (tokenizer.convert_tokens_to_ids)"
    ]
    # Without a readable config.json only a negative id is known to stop nothing.
    assert _stop_problems(tmp_path, "--rollout-stop-token-ids", "100000", "-1") == [
        "--rollout-stop-token-ids [-1]: not token ids the model samples (0 or more), so they stop nothing; give the "
        "ids of the stop tokens (tokenizer.convert_tokens_to_ids)"
    ]
    assert _stop_problems(tmp_path, "--hf-checkpoint", str(model), "--rollout-stop", " ", "--rollout-stop-token-ids",
                          "0", "99") == []  # fmt: skip
