"""Multi-turn generate when the env misbehaves: hangs (bounded, named deadlines), lone surrogates in calls and
observations, and a restarted partial episode (split from test_multi_turn.py; same scripted engine)."""

import asyncio
import threading

import pytest
from slime_multi_turn_fakes import (
    FINAL_TURN,
    TOOL_TURN,
    ScriptedEngine,
    calc_sample,
    enc,
    install,
    make_args,
    params,
)

from slime_core.protocols import EnvStep
from slime_core.sample import Sample, Status
from slime_rollout.generation import multi_turn
from slime_rollout.generation.template_check import CONVERSATION_KEY
from slime_rollout.runtime.deadlines import DeadlineExceeded

# ---- deadlines on the env's code (issue 27 #12: every await on user code is bounded and named) -----------------------

RELEASE = threading.Event()  # set at teardown: abandoned threads of a hung env then return


@pytest.fixture
def release_hung_envs():
    RELEASE.clear()
    yield
    RELEASE.set()


class HangsInReset:
    def reset(self, *, prompt, label, metadata):
        RELEASE.wait()  # sync code that never returns: it used to freeze the event loop itself

    async def step(self, model_turn):
        return EnvStep(observation="", done=True)


class HangsInStep:
    steps = 0

    def reset(self, *, prompt, label, metadata):
        pass

    async def step(self, model_turn):
        HangsInStep.steps += 1
        await asyncio.Event().wait()


class HangsWhenBuilt:
    def __init__(self):
        RELEASE.wait()  # e.g. a tool server that never accepts the connection


def _bounded(tok_dir, env):
    return make_args(tok_dir, env_path=f"{__name__}:{env}", plugin_timeout_secs=0.5, slow_call_warning_secs=0.2)


@pytest.mark.parametrize(("env", "phase"), [("HangsInReset", "reset"), ("HangsWhenBuilt", "construction")])
async def test_an_env_that_hangs_before_the_first_turn_fails_naming_it_and_the_sample(
    tok, qwen3_tokenizer_dir, monkeypatch, release_hung_envs, caplog, env, phase
):
    engine = ScriptedEngine(tok, [FINAL_TURN])
    install(monkeypatch, engine)
    args = _bounded(qwen3_tokenizer_dir, env)
    with pytest.raises(DeadlineExceeded) as e:
        await multi_turn.generate(args, Sample(prompt="x", index=5), params())
    assert str(e.value) == (
        f"env '{__name__}:{env}' {phase} for sample 5 did not finish within 0.5 s (--plugin-timeout-secs); cancelled"
    )
    assert engine.payloads == []  # no turn was generated for an episode that never started
    assert any("still running" in r.getMessage() and phase in r.getMessage() for r in caplog.records)


async def test_an_env_step_that_hangs_fails_the_rollout_not_the_sample_quietly(
    tok, qwen3_tokenizer_dir, monkeypatch, release_hung_envs
):
    HangsInStep.steps = 0
    install(monkeypatch, ScriptedEngine(tok, [TOOL_TURN, FINAL_TURN]))
    sample = Sample(prompt="x", index=2)
    with pytest.raises(DeadlineExceeded, match=rf"^env '{__name__}:HangsInStep' step for sample 2 did not finish "):
        await multi_turn.generate(_bounded(qwen3_tokenizer_dir, "HangsInStep"), sample, params())
    assert HangsInStep.steps == 1 and "env_error" not in sample.metadata


# ---- half a surrogate pair (round 12): text no tokenizer encodes -------------------------------------------------

SURROGATE_CALL_TURN = '<tool_call>\n{"name": "\\ud800", "arguments": {}}\n</tool_call><|im_end|>'


async def test_a_call_naming_half_a_surrogate_pair_is_an_error_observation(tok, qwen3_tokenizer_dir, monkeypatch):
    # The JSON escape decodes to "\ud800"; the unknown-tool error echoed it and tokenizing it raised TypeError.
    engine = ScriptedEngine(tok, [SURROGATE_CALL_TURN, FINAL_TURN])
    install(monkeypatch, engine)
    out = await multi_turn.generate(make_args(qwen3_tokenizer_dir), calc_sample(), params())
    assert out.status is Status.COMPLETED and out.metadata["num_turns"] == 2
    (segment,) = [s for s in out.metadata[CONVERSATION_KEY]["segments"] if s["role"] == "observation"]
    (response,) = segment["tool_responses"]
    assert response.startswith(
        "Error: invalid text in <tool_call>: ['name']: '\\ud800' at character 0 is half of a surrogate pair."
    )


class SurrogateEnv:
    """A tool that answers with a lone surrogate (a search hit's bad escape), then ends the episode."""

    def reset(self, *, prompt, label, metadata):
        self.turns = 0

    async def step(self, model_turn):
        self.turns += 1
        if self.turns == 1:
            return EnvStep(observation="a\ud800b", done=False, tool_responses=["a\ud800b"])
        return EnvStep(observation="", done=True)


async def test_an_observation_with_half_a_surrogate_pair_is_tokenized_with_u_fffd(
    tok, qwen3_tokenizer_dir, monkeypatch, caplog
):
    engine = ScriptedEngine(tok, [TOOL_TURN, FINAL_TURN])
    install(monkeypatch, engine)
    args = make_args(qwen3_tokenizer_dir, env_path=f"{__name__}:SurrogateEnv")
    out = await multi_turn.generate(args, Sample(prompt="x", index=4), params())
    obs = "\n<|im_start|>user\n<tool_response>\na\ufffdb\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    assert out.status is Status.COMPLETED and out.response == TOOL_TURN + obs + FINAL_TURN
    assert engine.payloads[1]["input_ids"][-len(enc(tok, obs)) :] == enc(tok, obs)
    assert "step for sample 4: 1 lone surrogate(s) in the observation replaced by U+FFFD" in caplog.text


class ToolRewardEnv:
    """Rewards a turn with a tool call 0.7 (not done); a turn without one ends the episode with no reward."""

    def reset(self, *, prompt, label, metadata):
        pass

    async def step(self, model_turn):
        if "<tool_call>" in model_turn:
            return EnvStep(observation="", done=False, reward=0.7, tool_responses=["42"])
        return EnvStep(observation="", done=True)


async def test_a_restarted_episode_keeps_nothing_of_the_aborted_attempt(tok, qwen3_tokenizer_dir, monkeypatch):
    # Round 12: the aborted attempt's env reward (and sample.reward from it) outlived the restart from the prompt.
    args = make_args(qwen3_tokenizer_dir, env_path=f"{__name__}:ToolRewardEnv")
    install(monkeypatch, ScriptedEngine(tok, [TOOL_TURN, "partial"], finish_types=["stop", "abort"]))
    sample = await multi_turn.generate(args, Sample(prompt="x", index=0), params())
    assert sample.status is Status.ABORTED and sample.reward == 0.7 and sample.metadata["num_turns"] == 2
    install(monkeypatch, ScriptedEngine(tok, [FINAL_TURN]))
    out = await multi_turn.generate(args, sample, params())
    assert out.status is Status.COMPLETED and out.response == FINAL_TURN
    assert out.reward is None and "env_reward" not in out.metadata
    assert out.metadata["num_turns"] == 1 and out.metadata["env_info"] == [{}]
