from slime_envs.python_env import PythonEnv


def call(code):
    import json

    return "<tool_call>" + json.dumps({"name": "code_interpreter", "arguments": {"code": code}}) + "</tool_call>"


async def test_code_interpreter_episode():
    env = PythonEnv(timeout_s=2, max_calls_per_turn=2)
    env.reset(prompt="p", label="42", metadata={"x": 1})
    step = await env.step(call("print(sum(range(10)))") + call("import math\nprint(math.factorial(5))"))
    assert step.tool_responses == ["45", "120"] and not step.done
    assert step.info["tool_calls"] == ["code_interpreter", "code_interpreter"]
    step = await env.step(call("while True:\n    pass"))
    assert step.tool_responses[0].endswith(
        "Error: execution timed out (wall-clock limit reached); the process was killed."
    )
    step = await env.step(call("print(open('/etc/passwd').read())"))
    assert "PermissionError: sandbox: reading '/etc/passwd'" in step.tool_responses[0]
    step = await env.step(call("   "))
    assert step.tool_responses == ["Error: 'code' must be a non-empty string of Python source."]
    step = await env.step("So the answer is \\boxed{42}.<|im_end|>")
    assert step.done and step.reward is None
    assert len(env.results) == 4


async def test_a_sandbox_gone_after_the_env_was_built_fails_the_step_not_the_models_answer(monkeypatch):
    # bubblewrap removed after the first run (an upgrade mid-run): run_python raised the bare BwrapMissingError, not
    # the documented SandboxUnavailableError, and the env showed it to the model as the code's result ("Error: tool
    # 'code_interpreter' failed: BwrapMissingError: ..."), a failure of the machine trained on as the model's.
    import pytest

    from slime_envs import _bwrap
    from slime_envs.sandbox import SandboxUnavailableError, run_python

    env = PythonEnv(timeout_s=2)
    env.reset(prompt="p", label="42", metadata={})
    which = _bwrap.shutil.which
    monkeypatch.setattr(_bwrap.shutil, "which", lambda name, **kw: None if name == "bwrap" else which(name, **kw))
    with pytest.raises(SandboxUnavailableError, match=r"needs bubblewrap \(`bwrap`\), which is not installed"):
        await run_python("print(1)")
    with pytest.raises(SandboxUnavailableError, match=r"needs bubblewrap \(`bwrap`\), which is not installed"):
        await env.step(call("print(1)"))
    assert env.results == [] and env.num_tool_calls == 1


async def test_a_host_failure_during_a_run_fails_the_step_not_the_models_answer(monkeypatch):
    # The host's side of a run failing (no space in the host's /tmp for the output files, no descriptor left) raised
    # a bare OSError, which the env showed to the model as the result of its code.
    import errno

    import pytest

    from slime_envs import sandbox
    from slime_envs.sandbox import SandboxUnavailableError

    env = PythonEnv(timeout_s=2)
    env.reset(prompt="p", label="42", metadata={})

    def full_disk():
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(sandbox.tempfile, "TemporaryFile", full_disk)
    with pytest.raises(SandboxUnavailableError, match=r"could not run on this host: .*No space left on device"):
        await sandbox.run_python("print(1)")
    with pytest.raises(SandboxUnavailableError, match=r"could not run on this host: .*No space left on device"):
        await env.step(call("print(1)"))
    monkeypatch.undo()
    assert (await sandbox.run_python("print(1)")).stdout == "1\n"  # nothing of the failed runs is left behind
