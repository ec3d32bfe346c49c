import importlib.metadata

import pytest

from slime_core.protocols import Env, EnvStep
from slime_envs import available_envs, get_env_factory, make_env, register_env
from slime_envs.calculator import CalculatorEnv
from slime_envs.registry import ENTRY_POINT_GROUP


class EchoEnv:
    def __init__(self, prefix="echo: "):
        self.prefix = prefix

    def reset(self, *, prompt, label, metadata):
        self.label = label

    async def step(self, model_turn):
        return EnvStep(observation=self.prefix + model_turn, done=True)


def test_builtins_are_declared_as_entry_points():
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
    assert names["calculator"] == "slime_envs.calculator:CalculatorEnv"
    assert {"search", "python", "calculator"} <= set(names)
    assert {"search", "python", "calculator"} <= set(available_envs())


def test_make_env_by_name_and_path():
    env = make_env("calculator", max_tool_calls=3)
    assert isinstance(env, CalculatorEnv) and isinstance(env, Env) and env.max_tool_calls == 3
    assert get_env_factory(f"{__name__}:EchoEnv") is EchoEnv
    assert get_env_factory(f"{__name__}.EchoEnv") is EchoEnv


async def test_register_env():
    register_env("echo-test")(EchoEnv)
    env = make_env("echo-test", prefix="> ")
    assert (await env.step("hi")).observation == "> hi"
    with pytest.raises(ValueError, match="already registered"):
        register_env("echo-test")(EchoEnv)


def test_errors():
    with pytest.raises(KeyError, match="unknown env 'nope'.*calculator"):
        make_env("nope")
    with pytest.raises(ImportError):
        make_env(f"{__name__}:Missing")
    with pytest.raises(TypeError, match="lacks reset"):
        make_env("builtins:dict")
