"""`--dry-run` refuses SGLang MoE flags on a dense `--hf-checkpoint` in one line (issue 27, item 8).

Before, `--sglang-ep-size 2` on Qwen3-4B passed the dry run ("--sglang-* flags not checked" without SGLang).
"""

import json
import pathlib

import pytest

from slime_app.cli import main

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def flags(tmp_path, stub_weights):
    model = stub_weights(tmp_path / "Qwen3-4B")
    config = {**json.loads((FIXTURES / "hf-configs" / "Qwen3-4B.json").read_text()), "transformers_version": "4.51.0"}
    (model / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).write_bytes((FIXTURES / "qwen3-tokenizer" / name).read_bytes())
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i} + 1 = ?", "label": str(i + 1)}) + "\n" for i in range(8)))
    return ["--dry-run", "--train-backend", "fsdp", "--hf-checkpoint", str(model), "--prompt-data", str(data),
            "--input-key", "prompt", "--label-key", "label", "--rollout-batch-size", "4", "--n-samples-per-prompt",
            "2", "--rollout-max-response-len", "16", "--actor-num-gpus-per-node", "2",
            "--rollout-num-gpus-per-engine", "2", "--num-rollout", "2"]  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "named"),
    # Engines of TP 2: the parse-time EP checks (`slime_core.config.sglang_ep`) pass, and the dry run's model check
    # is what refuses them.
    [
        (["--sglang-ep-size", "2"], "--sglang-ep-size 2"),
        (["--sglang-ep-size", "2", "--sglang-enable-eplb"], "--sglang-enable-eplb"),
    ],  # fmt: skip
)
def test_sglang_moe_flags_on_a_dense_model_fail_the_dry_run(flags, extra, named, capsys):
    assert main([*flags, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is a dense model" in err[0] and err[0].endswith(named), err


def test_sglang_defaults_pass(flags, capsys):
    assert main([*flags, "--sglang-ep-size", "1", "--sglang-moe-a2a-backend", "none"]) == 0, capsys.readouterr().err


def test_megatron_expert_parallelism_on_a_dense_model_fails_the_dry_run(flags, capsys):
    # It passed: --expert-model-parallel-size is a parallelism flag, not an architecture one, so the MoE-on-dense
    # check never saw it (Megatron-LM refuses EP without --num-experts).
    megatron = [*flags[: flags.index("--train-backend") + 1], "megatron", *flags[flags.index("--train-backend") + 2 :]]
    assert main([*megatron, "--expert-model-parallel-size", "2"]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("slime: error: --expert-model-parallel-size 2: --hf-checkpoint ") and err.endswith(
        "is a dense model (model_type 'qwen3', its config.json names no experts): there are no experts to split; "
        "remove the flag"
    ), err
    assert main([*megatron, "--expert-model-parallel-size", "1"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (
            ["--pipeline-model-parallel-size", "8"],
            "--pipeline-model-parallel-size 8: num_hidden_layers 36 is not divisible by 8",
        ),
        (
            ["--pipeline-model-parallel-size", "4", "--decoder-last-pipeline-num-layers", "10"],
            "--decoder-last-pipeline-num-layers 10 with --pipeline-model-parallel-size 4 and num_hidden_layers 36: "
            "the other 26 layers do not split evenly over the other 3 stage(s)",
        ),
        (
            ["--decoder-first-pipeline-num-layers", "12"],
            "--decoder-first-pipeline-num-layers 12 needs --pipeline-model-parallel-size > 1",
        ),
    ],
)
def test_megatron_pipeline_stages_the_layers_do_not_split_over_fail_the_dry_run(flags, extra, named, capsys):
    # Issue 27, hostile pass 31: these passed the dry run; megatron-core then stopped every rank while building the
    # model ("num_layers should be divisible by pipeline_model_parallel_size", "Mismatch: 24 middle layers
    # remaining but 0 middle PP stages"), or, first=36 with one stage, took the flag and did nothing.
    megatron = [*flags[: flags.index("--train-backend") + 1], "megatron", *flags[flags.index("--train-backend") + 2 :]]
    megatron[megatron.index("--actor-num-gpus-per-node") + 1] = "8"
    assert main([*megatron, *extra]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("slime: error: --hf-checkpoint ") and ": the Megatron layout does not fit: " in err, err
    assert named in err, err
    assert main([*megatron, "--pipeline-model-parallel-size", "4"]) == 0, capsys.readouterr().err


@pytest.mark.parametrize("tied", [True, False])
def test_a_tied_qwen3_moe_is_refused_for_sglang(flags, tied, capsys):
    # On one H100 a random Qwen3-MoE saved tied was sampled through SGLang's never-filled lm_head: engine log-probs
    # 0.55 from HF's, and the Megatron run stopped at its first-step check. Refused before the run instead.
    model = pathlib.Path(flags[flags.index("--hf-checkpoint") + 1])
    moe = json.loads((FIXTURES / "hf-configs" / "Qwen3-30B-A3B.json").read_text())
    (model / "config.json").write_text(json.dumps({**moe, "tie_word_embeddings": tied}))
    code = main(flags)
    err = capsys.readouterr().err.strip().splitlines()
    if not tied:  # as published: served as trained
        assert code == 0, err
        return
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"slime: error: --hf-checkpoint {model}: config.json ties the output head") and (
        "SGLang's Qwen3MoeForCausalLM always keeps a separate lm_head" in err[0]
    ), err
    # The reference engine (transformers) ties as the trainer does: a CPU run with it is not refused.
    assert main([*flags, "--rollout-engine", "reference"]) == 0, capsys.readouterr().err
