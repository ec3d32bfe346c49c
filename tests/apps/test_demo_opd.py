"""The on-policy-distillation demo's run config: valid, no training reward, a math-graded eval, the teacher flags."""

import yaml

from slime_app.demo import EVAL_DATA, MODEL_DIR
from slime_app.demo.opd import opd_argv
from slime_core.config import parse_args


def test_sglang_and_fsdp_teacher_configs(tmp_path):
    sglang = parse_args(opd_argv(tmp_path / "s", ["--opd-type", "sglang", "--rm-url", "http://t:1/generate"], 40))
    assert sglang.use_opd and sglang.opd_type == "sglang" and sglang.rm_type is None  # no task reward
    assert sglang.num_rollout == 40 and sglang.colocate and sglang.hf_checkpoint == str(MODEL_DIR)
    (dataset,) = yaml.safe_load((tmp_path / "s" / "eval.yaml").read_text())["eval"]["datasets"]
    assert dataset == {"name": "demo", "path": str(EVAL_DATA), "rm_type": "math"}  # eval keeps the task reward
    fsdp = parse_args(opd_argv(tmp_path / "f", ["--opd-type", "fsdp", "--opd-teacher-load", str(MODEL_DIR)], 8))
    assert fsdp.opd_type == "fsdp" and fsdp.opd_teacher_load == str(MODEL_DIR) and fsdp.rm_url is None
