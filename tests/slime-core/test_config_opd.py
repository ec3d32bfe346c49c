"""`--opd-type` asks the train-backend record whether it holds a teacher (`supports_opd_teacher`), not its name.

The original's values stay: `sglang` (a teacher engine) and `megatron` (the teacher in the trainer, any backend
that can hold one); a package's backend that sets the capability is accepted by its own name.
"""

import pytest

from slime_core.config import ConfigError, SlimeArgs, validation
from slime_core.config import base as config_base
from slime_core.config.opd import trainer_side_teacher
from slime_core.extensions import TRAIN_BACKENDS, TrainBackendSpec

BASE = {"rollout_batch_size": 4, "num_rollout": 1}


@pytest.fixture(autouse=True)
def backends(monkeypatch):
    """Two CPU backends of a package: `teacher_pkg` holds a teacher, `plain_pkg` does not."""
    monkeypatch.setattr(config_base, "_WARNED", set())
    monkeypatch.setattr(validation, "_cuda_available", lambda: False)
    specs = [
        TrainBackendSpec(name="teacher_pkg", factory=object, needs_gpu=False, supports_opd_teacher=True),
        TrainBackendSpec(name="plain_pkg", factory=object, needs_gpu=False),
    ]
    for spec in specs:
        TRAIN_BACKENDS.register(spec)
    yield
    for spec in specs:
        TRAIN_BACKENDS.unregister(spec.name)


def make(**overrides):
    return SlimeArgs.from_dict({**BASE, **overrides})


def test_a_package_backend_that_holds_a_teacher_is_an_opd_type(tmp_path):
    teacher = {"use_opd": True, "opd_teacher_load": str(tmp_path), "train_backend": "teacher_pkg"}
    cfg = make(**teacher, opd_type="teacher_pkg")
    assert cfg.opd_type == "teacher_pkg" and trainer_side_teacher(cfg)
    assert trainer_side_teacher(make(**teacher, opd_type="megatron"))  # the original's value, any such backend
    assert not trainer_side_teacher(make(use_opd=True, opd_type="sglang", rm_url="http://t:1/generate"))
    assert all(TRAIN_BACKENDS.get(name).supports_opd_teacher for name in ("fsdp", "megatron"))


def test_a_backend_without_the_capability_cannot_hold_the_teacher(tmp_path):
    plain = {"use_opd": True, "opd_teacher_load": str(tmp_path), "train_backend": "plain_pkg"}
    refused = r"^--opd-type megatron: --train-backend plain_pkg cannot hold a teacher \(its record sets no "
    with pytest.raises(ConfigError, match=refused + r"supports_opd_teacher\); use --opd-type sglang .*teacher_pkg"):
        make(**plain, opd_type="megatron")
    # Its own name is no teacher type; the message lists the backends that hold one.
    with pytest.raises(ConfigError, match=r"^--opd-type plain_pkg: expected sglang \(a teacher engine\), megatron "
                       r"\(the teacher in the trainer\) or a train backend that holds a teacher \(fsdp, megatron, "
                       r"teacher_pkg\)$"):  # fmt: skip
        make(**plain, opd_type="plain_pkg")
    assert make(use_opd=True, opd_type="sglang", rm_url="http://t:1/generate", train_backend="plain_pkg").use_opd


def test_a_trainer_side_type_names_the_running_backend(tmp_path):
    with pytest.raises(ConfigError, match=r"^--opd-type teacher_pkg needs --train-backend teacher_pkg \(use "
                       r"--opd-type megatron with --train-backend fsdp\)$"):  # fmt: skip
        make(use_opd=True, opd_type="teacher_pkg", opd_teacher_load=str(tmp_path), train_backend="fsdp")


def test_an_unknown_opd_type_is_refused_even_without_use_opd():
    # It was a Literal: argparse refused it whatever the other flags; a value no backend takes still fails.
    with pytest.raises(ConfigError, match=r"^--opd-type vllm: expected sglang"):
        make(opd_type="vllm")
