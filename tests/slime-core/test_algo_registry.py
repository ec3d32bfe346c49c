import pytest

from slime_core.algorithms import registry
from slime_core.algorithms.registry import (
    get_advantage_estimator,
    get_policy_loss,
)


def test_builtin_names_are_registered():
    names = registry.ADVANTAGE_ESTIMATORS.names()
    builtins = {"grpo", "gspo", "cispo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"}
    assert builtins <= set(names) and names == sorted(names)  # plus those of installed packages
    assert registry.POLICY_LOSSES.names() == ["cispo", "gspo", "ppo"]
    assert get_advantage_estimator("grpo") is get_advantage_estimator("gspo")  # same broadcast estimator


@pytest.mark.parametrize("getter", [get_advantage_estimator, get_policy_loss])
def test_unknown_name_lists_known(getter):
    with pytest.raises(KeyError, match="known: .*ppo"):
        getter("no_such_algo")


def test_register_and_duplicate():
    reg = registry.Registry("thing")

    @reg.register("a")
    def fn():
        return 1

    assert reg.get("a") is fn
    with pytest.raises(ValueError, match="already registered"):
        reg.register("a")(fn)
