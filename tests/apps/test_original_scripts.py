"""Each original launch script's flag set (paths swapped for fixtures) goes through `apps/train --dry-run`.

A script either passes (every flag honoured, checked against its checkpoint's config.json, or a documented
no-op) or stops with one `not implemented` / `cannot` line that says what to use instead. Nothing starts.
The original's `scripts/run-*.sh` and its `examples/*/*.sh` (`example-<folder>-<script>.args`); an example's own
plugin module is replaced by the stand-in of `tests/slime-compat/example_plugins` where one exists.
"""

import importlib.machinery
import json
import pathlib
import pickle
import re
import shutil
import sys
import types

import pytest
import torch
import yaml
from safetensors.torch import save_file
from torch.distributed.checkpoint.metadata import Metadata

from slime_app.cli import main

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"

SCRIPTS = sorted((FIXTURES / "original-scripts").glob("*.args"))
EXAMPLE_PLUGINS = FIXTURES.parent / "slime-compat" / "example_plugins"

# --hf-checkpoint basename -> config.json in tests/fixtures/hf-configs, or the model_type of a stand-in config.
CHECKPOINTS = {
    "Qwen3-4B": "Qwen3-4B", "Qwen3-4B-FP8": "Qwen3-4B", "Qwen3-4B-Base": "Qwen3-4B-Base", "Qwen3-32B": "Qwen3-32B",
    "Qwen3-30B-A3B": "Qwen3-30B-A3B", "Qwen3-30B-A3B-FP8": "Qwen3-30B-A3B", "Qwen3-30B-A3B-INT4": "Qwen3-30B-A3B",
    "Qwen3-235B-A22B": "Qwen3-235B-A22B", "Qwen3-235B-A22B-FP8": "Qwen3-235B-A22B",
    "Qwen3-235B-A22B-INT4": "Qwen3-235B-A22B", "Qwen2.5-0.5B-Instruct": "Qwen2.5-0.5B-Instruct",
    "GLM-Z1-9B-0414": "GLM-Z1-9B-0414", "Qwen3-8B": "Qwen3-8B", "Qwen2.5-3B": "Qwen2.5-3B",
    "Qwen3-4B-Instruct-2507": "Qwen3-4B-Instruct-2507", "qwen3-4b-sft": "Qwen3-4B-Instruct-2507",
}  # fmt: skip
STAND_INS = {
    "DeepSeek-R1": "deepseek_v3", "GLM-4.7-Flash": "glm4_moe_lite", "GLM-4.7-355B-A32B": "glm4_moe",
    "GLM-5": "glm_moe_dsa", "GLM-5.2-FP8": "glm_moe_dsa", "Kimi-K2-Thinking": "kimi_k2",
    "Kimi-K2-Thinking-fp8": "kimi_k2",
    "MiMo-7B-RL": "mimo", "MiniMax-M2.5": "minimax_m2", "Moonlight-16B-A3B": "deepseek_v3",
    "Moonlight-16B-A3B-Instruct-INT4": "deepseek_v3", "Qwen3-Next-80B-A3B-Thinking": "qwen3_next",
    "Qwen3.5-27B": "qwen3_5", "Qwen3.5-35B-A3B": "qwen3_5_moe", "Qwen3.5-9B": "qwen3_5",
    "Qwen3.6-35B-A3B": "qwen3_5_moe",
}  # fmt: skip
# An example's plugin (its folder on the original's PYTHONPATH) -> the stand-in written for tests/slime-compat.
PLUGIN_STAND_INS = {
    "generate_with_retool.generate": "ex_retool.generate", "generate_with_retool.reward_func": "ex_retool.reward_func",
    "generate_with_search.generate": "ex_search_r1.generate",
    "generate_with_search.reward_func": "ex_search_r1.reward_func",
    "generate_with_tau.generate": "ex_tau_bench.generate",
    "examples.multi_agent.rollout_with_multi_agents.generate_with_multi_agents": "ex_multi_agent.generate",
}  # fmt: skip
# The settings of the original's examples/train_infer_mismatch_helper/mis.yaml (--custom-config-path).
_MIS_YAML = {"use_tis": True, "use_rs": True, "tis_level": "token", "rs_level": "token", "tis_mode": "truncate",
             "tis_lower_bound": 0.5, "tis_upper_bound": 2.0, "rs_lower_bound": None, "rs_upper_bound": None,
             "rs_veto_threshold": 1.0e-4, "tis_batch_normalize": True}  # fmt: skip
# examples/eval_multi_task/multi_task.yaml (--eval-config): its datasets, with the fixture data in place of its paths.
_EVAL_DATASETS = [("aime", "deepscaler", 16), ("gpqa", "gpqa", 2), ("ifbench", "ifbench", 1)]

_CHAT = [{"role": "user", "content": "What is 3 + 4?"}]
_SFT = [{"role": "user", "content": "Say hi."}, {"role": "assistant", "content": "Hi!"}]


def read_script(path: pathlib.Path) -> tuple[str, list[str]]:
    """`(program, flags)` of a fixture: `train.py` or `train_async.py`, and the flag tokens."""
    lines = [line for line in path.read_text().splitlines() if line]
    return lines[1], lines[2:]


def _model(root: pathlib.Path, name: str, tokenizer_dir: pathlib.Path) -> pathlib.Path:
    out = root / "models" / name
    if out.exists():
        return out
    out.mkdir(parents=True)
    if name in CHECKPOINTS:
        shutil.copy(FIXTURES / "hf-configs" / f"{CHECKPOINTS[name]}.json", out / "config.json")
    else:
        config = {"model_type": STAND_INS[name]}
        if STAND_INS[name] == "kimi_k2":  # as the published config.json: its own code (trust_remote_code)
            config["auto_map"] = {"AutoConfig": "configuration_deepseek.DeepseekV3Config"}
        (out / "config.json").write_text(json.dumps(config))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / f, out / f)
    # The engines load weights from it: a config-only folder is refused (a one-tensor file whose name no check reads).
    save_file({"stub.weight": torch.ones(4)}, str(out / "model.safetensors"))
    return out


def _data(root: pathlib.Path, original: str, input_key: str, label_key: str | None) -> pathlib.Path:
    path = pathlib.Path(original)
    out = root / "data" / path.parent.name / path.name  # two scripts' train.parquet hold different columns
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # 256 rows: an SFT script's --rollout-batch-size 128 × --num-epoch 3 gives 2 rollouts per epoch, 6 in all.
    sft = "openhermes" in original or "SFT" in original
    rows = [{input_key: _SFT if sft else _CHAT} for _ in range(256)]
    for row in rows:
        if label_key:
            row[label_key] = "7"
    if out.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), out)
    else:
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def _torch_dist(root: pathlib.Path, original: str) -> pathlib.Path:
    out = root / "ckpt" / pathlib.Path(original.rstrip("/")).name
    (out / "release").mkdir(parents=True, exist_ok=True)
    (out / "latest_checkpointed_iteration.txt").write_text("release")
    # A checkpoint index without tensors: its kind is checked, its shapes leave nothing to compare.
    (out / "release" / ".metadata").write_bytes(pickle.dumps(Metadata(state_dict_metadata={})))
    return out


def _yaml(out: pathlib.Path, content: dict) -> pathlib.Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(content))
    return out


def swap_paths(flags: list[str], root: pathlib.Path, tokenizer_dir: pathlib.Path) -> list[str]:
    """The flags with every `/root/...` path replaced by a fixture under `root` (same basenames)."""
    out = list(flags)
    value = {f: out[i + 1] for i, f in enumerate(out[:-1]) if f.startswith("--")}
    input_key, label_key = value.get("--input-key", "input"), value.get("--label-key")
    for i, token in enumerate(out[:-1]):
        nxt = out[i + 1]
        if token == "--hf-checkpoint":
            out[i + 1] = str(_model(root, pathlib.Path(nxt.rstrip("/")).name, tokenizer_dir))
        elif token in ("--ref-load", "--opd-teacher-load"):
            out[i + 1] = str(_torch_dist(root, nxt))
        elif nxt in PLUGIN_STAND_INS:
            out[i + 1] = PLUGIN_STAND_INS[nxt]
        elif token == "--custom-config-path":
            out[i + 1] = str(_yaml(root / "mis.yaml", _MIS_YAML))
        elif token == "--eval-config":
            datasets = [{"name": name, "path": str(_data(root, f"/root/{name}/{name}.jsonl", "prompt", "label")),
                         "rm_type": rm, "n_samples_per_eval_prompt": n} for name, rm, n in _EVAL_DATASETS]  # fmt: skip
            out[i + 1] = str(_yaml(root / "multi_task.yaml", {"eval": {"defaults": {"max_response_len": 16384,
                                                                                    "top_p": 0.7},
                                                                       "datasets": datasets}}))  # fmt: skip
        elif token in ("--load", "--save"):
            out[i + 1] = str(root / "ckpt" / pathlib.Path(nxt.rstrip("/")).name)
        elif token == "--prompt-data":
            out[i + 1] = str(_data(root, nxt, input_key, label_key))
        elif token == "--eval-prompt-data":
            j = i + 1 if nxt.startswith("/") else i + 2  # one bare path is the original's legacy "aime" form
            out[j] = str(_data(root, out[j], input_key, label_key))
    return out


_MULTI_NODE_ENGINE = r"exceeds --num-gpus-per-node 8: engines spanning several nodes are not implemented; use at most 8"
_NOT_MEGATRON = (
    r"--train-backend megatron: cannot build this model \(model_type='{}' is not supported.*use --train-backend fsdp"
)

# Script -> None (the dry run passes) or the one error line it stops with. The scripts default to Megatron.
EXPECTED = {
    "run-qwen3-4B": None,
    "run-qwen3-4b-fp8": None,  # an FP8 --hf-checkpoint for the engines, bf16 training
    "run-qwen3-4B-base-sft": None,  # --num-epoch, the SFT rollout and loss masks, --async with --debug-train-only
    "run-qwen3-32B": None,
    "run-qwen3-30B-A3B": None,  # MoE: CPU optimizer offload, router dtype, aux loss 0, drop policy, permute fusion
    "run-qwen3-30B-A3B-int4": None,  # the legacy single --eval-prompt-data path
    "run-qwen3-235B-A22B-sft": None,
    "run-qwen3-235B-A22B-int4": None,
    "run-qwen2.5-0.5B-reproducibility": None,  # --deterministic-mode, parquet data with chat messages
    "run-qwen2.5-0.5B-gb10-smoke": None,
    "run-qwen3-235B-A22B": "--rollout-num-gpus-per-engine 32 " + _MULTI_NODE_ENGINE,
    "run-qwen3-30b-a3b-fp8": r"--fp8-format is not implemented with --train-backend megatron \(no FP8 training",
    "run-qwen3-4B-amd": None,  # --colocate --no-offload-train: the trainer stays resident while the engines run
    "run-glm4-9B": None,  # --spec get_glm_spec: sandwich norms, interleaved half RoPE, CP 2 (Megatron builds GLM4)
    "run-qwen3-next-80B-A3B": _NOT_MEGATRON.format("qwen3_next"),
    "run-qwen3.5-27B": _NOT_MEGATRON.format("qwen3_5"),
    "run-qwen3.5-35B-A3B-sft": _NOT_MEGATRON.format("qwen3_5_moe"),
    # --make-vocab-size-divisible-by 64 is honoured (the Megatron embedding's padding); MTP training is not.
    "run-glm4.7-30B-A3B": r"--enable-mtp-training is not implemented with --train-backend megatron",
    "run-glm4.7-355B-A32B": "--rollout-num-gpus-per-engine 32 " + _MULTI_NODE_ENGINE,
    "run-deepseek-r1": "--rollout-num-gpus-per-engine 64 " + _MULTI_NODE_ENGINE,
    "run-kimi-k2-Thinking": "--rollout-num-gpus-per-engine 16 " + _MULTI_NODE_ENGINE,
    "run-kimi-k2-Thinking-int4": _NOT_MEGATRON.format("kimi_k2"),
    "run-moonlight-16B-A3B": _NOT_MEGATRON.format("deepseek_v3"),
    "run-moonlight-16B-A3B-int4": _NOT_MEGATRON.format("deepseek_v3"),
    "run-glm5-744B-A40B": r"--data-pad-size-multiplier is not implemented in this version",
    "run-glm5.2-744B-A40B": r"--data-pad-size-multiplier is not implemented in this version",
    "run-mimo-7B-rl-eagle": r"--enable-mtp-training is not implemented with --train-backend megatron",
    "run-minimax-m2": r"--model-name is not implemented in this version",
    # The original's examples/*/*.sh.
    "example-coding_agent_rl-run_qwen36_35b_a3b_swe_8nodes": (
        r"--custom-generate-function-path: module 'examples.coding_agent_rl.generate' not found"
    ),
    "example-delta_weight_sync-run-glm4.7-30B-A3B-delta": _NOT_MEGATRON.format("glm4_moe_lite"),
    "example-eval_multi_task-multi_task": None,  # --eval-config: three datasets, each its grader and sample count
    "example-fully_async-run-qwen2.5-0.5B-fully_async": None,  # the fully-async rollout function under train_async.py
    "example-fully_async-run-qwen3.5-9B-fully_async": _NOT_MEGATRON.format("qwen3_5"),
    "example-geo3k_vlm-run_geo3k_qwen35": r"--multimodal-keys: the Megatron backend builds text-only GPT models; train",
    "example-multi_agent-run-qwen3-30B-A3B-multi-agent": None,
    # The original grades every sample 0 there (no label); here the missing --label-key is named.
    "example-on_policy_distillation-run-qwen3-8B-opd-megatron": r"--rm-type math grades against a label, but no",
    "example-on_policy_distillation-run-qwen3-8B-opd": None,  # a teacher engine at --rm-url scores the responses
    "example-retool-retool_qwen3_4b_rl": None,  # --reward-key score of a dict reward
    "example-retool-retool_qwen3_4b_sft": None,
    "example-search-r1-run_qwen2.5_3B": None,
    "example-strands_sglang-strands_qwen3_8b": r"module 'examples.strands_sglang.generate_with_strands' not found",
    "example-tau-bench-run_qwen3_4B": None,
    "example-train_infer_mismatch_helper-run-qwen3-4b-mis": None,  # the MIS helper's path loads the built-in one
}


def _dry_run(script: pathlib.Path, root: pathlib.Path, capsys, *extra: str) -> tuple[int, str, str]:
    program, flags = read_script(script)
    argv = ["--dry-run", *swap_paths([*flags, *extra], root, FIXTURES / "qwen3-tokenizer")]
    if program == "train_async.py":  # the original's one-step-ahead loop is --async here
        argv.append("--async")
    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_every_fixture_script_has_an_expectation():
    assert {p.stem for p in SCRIPTS} == set(EXPECTED)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_original_script_dry_run(script, tmp_path_factory, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))  # --output-dir defaults to ./outputs
    # Scripts that pass --use-wandb are checked as on a machine with W&B installed (preflight refuses the flag where
    # the package is missing: test_dry_run_refuses_use_wandb_without_the_package).
    wandb = types.ModuleType("wandb")
    wandb.__spec__ = importlib.machinery.ModuleSpec("wandb", None)
    monkeypatch.setitem(sys.modules, "wandb", wandb)
    # And with IFBench's checks on PYTHONPATH, as eval_multi_task's ifbench dataset needs (its README installs them;
    # preflight refuses the dataset without them: test_reward_types_the_rows_name_are_checked_as_rm_type_is).
    ifbench = types.ModuleType("evaluation_lib")
    ifbench.__spec__ = importlib.machinery.ModuleSpec("evaluation_lib", None)
    monkeypatch.setitem(sys.modules, "evaluation_lib", ifbench)
    monkeypatch.syspath_prepend(str(EXAMPLE_PLUGINS))
    root = tmp_path_factory.getbasetemp() / "original-scripts"
    rc, out, err = _dry_run(script, root, capsys)
    expected = EXPECTED[script.stem]
    if expected is None:
        assert rc == 0, err
        assert out.startswith("slime --dry-run: the configuration is valid; nothing was started")
        assert "Megatron architecture flags agree with config.json" in out
        assert not (pathlib.Path.cwd() / "outputs").exists()  # nothing written
    else:
        assert rc == 2, out
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("slime: error: "), err
        assert re.search(expected, lines[0]), lines[0]


def test_the_same_scripts_under_fsdp(tmp_path, capsys):
    # Megatron's tensor parallelism has no FSDP counterpart: one line naming the flag and the alternative.
    rc, _, err = _dry_run(FIXTURES / "original-scripts" / "run-qwen3-4B.args", tmp_path, capsys, "--train-backend",
                          "fsdp")  # fmt: skip
    assert rc == 2 and err.strip() == (
        "slime: error: --tensor-model-parallel-size 2 is not implemented with --train-backend fsdp, only 1 (FSDP "
        "shards parameters over all trainer ranks: use --train-backend megatron for tensor parallelism)"
    )
    # TP 1 there: every flag is honoured; the full recompute becomes gradient checkpointing, and the torch_dist
    # --ref-load is not read (no KL term in SFT, and FSDP starts from --hf-checkpoint).
    rc, out, err = _dry_run(FIXTURES / "original-scripts" / "run-qwen3-4B-base-sft.args", tmp_path, capsys,
                            "--train-backend", "fsdp")  # fmt: skip
    assert rc == 0, err
    assert "--gradient-checkpointing" in out and "not read (no KL term" in out
    assert "Megatron flags, no effect here (kernel/logging): --sequence-parallel --attention-backend" in out


def test_the_opd_example_with_megatron_teacher_passes_once_its_label_column_is_named(tmp_path, capsys):
    # Its only refusal: the math grader has no label to grade against (the original scored every sample 0). With the
    # column named, the Megatron teacher (--opd-type megatron, --opd-teacher-load torch_dist) is accepted.
    script = FIXTURES / "original-scripts" / "example-on_policy_distillation-run-qwen3-8B-opd-megatron.args"
    rc, out, err = _dry_run(script, tmp_path, capsys, "--label-key", "label")
    assert rc == 0, err
    assert out.startswith("slime --dry-run: the configuration is valid; nothing was started")


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        # Was a ZeroDivisionError traceback from the dry run's layout arithmetic.
        (["--context-parallel-size", "0"], "--context-parallel-size: expected an integer >= 1, got '0'"),
        # These passed the dry run and failed in the GPU workers, after Ray and the engines had started.
        (["--pipeline-model-parallel-size", "3"],
         "--train-backend megatron: world size 8 is not divisible by TP×PP×CP = 2×3×1"),
        (["--expert-model-parallel-size", "16"],
         "--train-backend megatron: world size 8 is not divisible by EP×ETP×PP = 16×1×1"),
        (["--recompute-granularity", "bogus"], "--train-backend megatron: invalid Megatron settings: "
                                               "--recompute-granularity bogus: Input should be 'full' or 'selective'"),
    ],
)  # fmt: skip
def test_a_megatron_layout_or_value_the_workers_refuse_is_one_line_at_the_dry_run(tmp_path, capsys, extra, error):
    rc, _, err = _dry_run(FIXTURES / "original-scripts" / "run-qwen3-4B.args", tmp_path, capsys, *extra)
    assert rc == 2 and err.strip() == f"slime: error: {error}"


def test_the_glm47_30b_expert_layout_stops_the_dry_run_with_the_backends_line(tmp_path, capsys):
    """run-glm4.7-30B-A3B's layout (TP 2, PP 2, CP 2, EP 8 on 8 GPUs: EP×ETP×PP = 16 ranks per expert replica) is
    refused by the Megatron trainer (`MegatronSettings.world_layout`); the dry run says the same line. The flags it
    refuses first (MTP training) are left out here so that the layout is what it checks."""
    from slime_core.config import parse_args
    from slime_train_megatron.settings import MegatronSettings

    program, flags = read_script(FIXTURES / "original-scripts" / "run-glm4.7-30B-A3B.args")
    for flag, takes_value in (("--enable-mtp-training", False), ("--mtp-num-layers", True),
                              ("--mtp-loss-scaling-factor", True)):  # fmt: skip
        i = flags.index(flag)
        del flags[i : i + 1 + takes_value]
    script = tmp_path / "run-glm4.7-30B-A3B.args"
    script.write_text("\n".join(["python3", program, *flags]) + "\n")
    rc, _, err = _dry_run(script, tmp_path / "root", capsys)
    cfg = parse_args(swap_paths(flags, tmp_path / "root", FIXTURES / "qwen3-tokenizer"))
    with pytest.raises(ValueError) as backend:
        MegatronSettings.from_config(cfg).world_layout(cfg.actor_num_nodes * cfg.actor_num_gpus_per_node)
    assert str(backend.value) == "world size 8 is not divisible by EP×ETP×PP = 8×1×2"
    assert rc == 2 and err.strip() == f"slime: error: --train-backend megatron: {backend.value}"


def test_context_parallelism_without_transformer_engine_is_named_at_the_dry_run(tmp_path, capsys, monkeypatch):
    """run-glm4-9B's `--context-parallel-size 2` needs Transformer Engine's layer spec: with `--transformer-impl local`
    the dry run said the configuration was valid and every trainer rank then stopped at start; unset, the dry run
    cannot see the trainer machines' packages, so it says what they need."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "transformer_engine" else
                        find_spec(name, *a))  # fmt: skip
    script = FIXTURES / "original-scripts" / "run-glm4-9B.args"
    need = (
        "--train-backend megatron: --context-parallel-size > 1 needs Transformer Engine (--transformer-impl "
        "transformer_engine): the local spec's attention (--attention-backend flash) has no context-parallel exchange"
    )
    rc, _, err = _dry_run(script, tmp_path, capsys, "--transformer-impl", "local")
    assert rc == 2 and err.strip() == f"slime: error: {need}"
    rc, out, err = _dry_run(script, tmp_path, capsys)
    assert rc == 0, err
    assert f"  {need}. Transformer Engine is not importable here: a trainer machine without it stops at start\n" in out
