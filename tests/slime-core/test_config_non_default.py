"""`config.base.non_default`: the one test of "is this flag set?", right for fields with a default factory.

`estimators.EstimatorSpec._warn_unread` compared with `FieldInfo.default`, which is pydantic's "no default" marker
for a `default_factory` field: such a flag always counted as set (a warning for a flag nobody gave);
`config.unsupported` had its own copy of the comparison.
"""

import pytest
from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from slime_core import estimators
from slime_core.config import SlimeArgs
from slime_core.config import base as config_base
from slime_core.config.base import non_default
from slime_core.config.unsupported import check_unsupported

BASE = {"rollout_batch_size": 1, "num_rollout": 1, "n_samples_per_prompt": 2, "global_batch_size": 2}


class _Flags(BaseModel):
    names: list[str] = Field(default_factory=list)
    options: dict[str, int] = Field(default_factory=dict)
    gamma: float = 1.0


def test_a_default_factory_value_is_the_default():
    assert non_default(_Flags(), ["names", "options", "gamma"]) == []
    assert non_default(_Flags(names=["a"], gamma=0.9), ["names", "options", "gamma"]) == ["names", "gamma"]
    assert non_default(_Flags(options={"a": 1}), ["gamma", "options"]) == ["options"]


def test_the_config_flags_given_are_the_non_default_ones():
    cfg = SlimeArgs.from_dict({**BASE, "lambd": 0.5})
    assert non_default(cfg, ["gamma", "lambd", "num_rollout"]) == ["lambd", "num_rollout"]
    with pytest.raises(AttributeError):
        non_default(cfg, ["gama"])


@pytest.mark.parametrize(("value", "warned"), [([], False), (["x"], True)])
def test_an_estimator_list_flag_at_its_factory_default_draws_no_warning(monkeypatch, caplog, value, warned):
    # A list flag declared with a default factory, read by no estimator: set, it warns; at its default, it does not.
    monkeypatch.setitem(SlimeArgs.model_fields, "megatron_args", FieldInfo(default_factory=list))
    monkeypatch.setattr(estimators, "ESTIMATOR_FLAGS", (*estimators.ESTIMATOR_FLAGS, "megatron_args"))
    monkeypatch.setattr(config_base, "_WARNED", set())
    cfg = SlimeArgs.from_dict({**BASE, "megatron_args": value})
    with caplog.at_level("WARNING"):
        estimators.get_estimator("grpo")._warn_unread(cfg)
    lines = [r.getMessage() for r in caplog.records if "no effect with --advantage-estimator grpo" in r.getMessage()]
    expected = "--megatron-args ['x']: no effect with --advantage-estimator grpo, which does not read it"
    assert lines == ([f"{expected} (--megatron-args is read by no built-in)"] if warned else [])


def test_unsupported_flags_use_the_same_test():
    check_unsupported(SlimeArgs.from_dict(BASE))  # every unsupported flag at its default: no error
    with pytest.raises(ValueError, match="^--keep-old-actor is not implemented in this version"):
        check_unsupported(SlimeArgs.from_dict(BASE).model_copy(update={"keep_old_actor": True}))
