"""FP8 rollout in the app: pushes are quantized on rank 0, the first-step gate has FP8 defaults, preflight rules."""

import json

import pytest
import torch
from safetensors.torch import save_file

from slime_app import weights
from slime_app.fp8_rollout import FP8_LOGPROB_DIFF_THRESHOLD, check_fp8_rollout, logprob_gate_thresholds
from slime_app.guards import LOGPROB_DIFF_WARN, RunStopped, first_step_logprob_gate
from slime_core.config import SlimeArgs
from slime_core.fp8 import FP8_DTYPE, Fp8Config, quantize_blockwise

DIFF = "train/train_rollout_logprob_abs_diff"


def _checkpoint(path, fp8: bool):
    path.mkdir()
    config = {"model_type": "qwen3"}
    if fp8:
        config["quantization_config"] = Fp8Config(weight_block_size=(2, 2)).to_quantization_config()
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def _cfg(**fields):
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, **fields})


class _Backend:
    def __init__(self):
        torch.manual_seed(0)
        self.up = torch.randn(4, 6)
        self.norm = torch.ones(4)

    def named_hf_weights(self, bucket_bytes):
        yield [("model.layers.0.mlp.up_proj.weight", self.up), ("model.norm.weight", self.norm)]


class _Updater:
    def __init__(self):
        self.pushed = []

    def update(self, buckets, version):
        self.pushed += [pair for bucket in buckets for pair in bucket]


def test_every_push_is_quantized_blockwise_when_the_engines_serve_fp8(tmp_path):
    backend, updater = _Backend(), _Updater()
    cfg = _cfg(hf_checkpoint=_checkpoint(tmp_path / "fp8", fp8=True))
    metrics = weights.push_weights(backend, updater, cfg, 1, rank=0)
    names = [n for n, _ in updater.pushed]
    assert names == ["model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight_scale_inv",
                     "model.norm.weight"]  # fmt: skip
    q, s = quantize_blockwise(backend.up, (2, 2))
    pushed = dict(updater.pushed)
    assert pushed["model.layers.0.mlp.up_proj.weight"].dtype == FP8_DTYPE
    assert torch.equal(pushed["model.layers.0.mlp.up_proj.weight"].view(torch.uint8), q.view(torch.uint8))
    assert torch.equal(pushed["model.layers.0.mlp.up_proj.weight_scale_inv"], s)
    assert pushed["model.norm.weight"] is backend.norm
    # Bytes sent: 24 e4m3 + 2×3 fp32 scales + 4 fp32 norm weights.
    assert metrics["perf/update_weights_gb_per_s"] * metrics["perf/update_weights_time"] * 1e9 == pytest.approx(64)

    plain = _Updater()
    weights.push_weights(backend, plain, _cfg(hf_checkpoint=_checkpoint(tmp_path / "bf16", fp8=False)), 1, rank=0)
    assert [t for _, t in plain.pushed] == [backend.up, backend.norm]


def test_a_push_refused_by_the_quantizer_still_walks_the_collective_gather_to_the_end(tmp_path):
    # Every trainer rank walks `named_hf_weights` together (each bucket is a collective gather); rank 0 quantizes.
    # A bucket the quantizer refuses (an inf weight) ended rank 0's walk there, while the other ranks waited in the
    # next bucket's gather: the run hung instead of stopping on the error.
    walked = []

    class Backend:
        def named_hf_weights(self, bucket_bytes):
            for i in range(3):
                walked.append(i)
                w = torch.ones(4, 4)
                w[0, 0] = float("inf") if i == 0 else 1.0
                yield [(f"model.layers.{i}.mlp.up_proj.weight", w)]

    cfg = _cfg(hf_checkpoint=_checkpoint(tmp_path / "fp8", fp8=True))
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.up_proj\.weight hold\(s\) inf or NaN"):
        weights.push_weights(Backend(), _Updater(), cfg, 1, rank=0)
    assert walked == [0, 1, 2]


def test_first_step_gate_has_fp8_defaults_unless_the_flag_is_given(tmp_path, caplog):
    fp8_dir = _checkpoint(tmp_path / "fp8", fp8=True)
    cfg = _cfg(hf_checkpoint=fp8_dir)
    assert logprob_gate_thresholds(cfg, LOGPROB_DIFF_WARN) == (FP8_LOGPROB_DIFF_THRESHOLD, 0.15)
    first_step_logprob_gate(cfg, {DIFF: 0.2})  # above BF16's 0.1: only a warning in FP8 mode
    assert "0.2 > 0.15" in caplog.text
    with pytest.raises(RunStopped, match=r"0.35 > 0.3 \(--first-step-logprob-diff-threshold\)"):
        first_step_logprob_gate(cfg, {DIFF: 0.35})
    explicit = _cfg(hf_checkpoint=fp8_dir, first_step_logprob_diff_threshold=0.1)
    with pytest.raises(RunStopped, match=r"0.2 > 0.1"):
        first_step_logprob_gate(explicit, {DIFF: 0.2})
    bf16 = _cfg(hf_checkpoint=_checkpoint(tmp_path / "bf16", fp8=False))
    assert logprob_gate_thresholds(bf16, LOGPROB_DIFF_WARN) == (0.1, LOGPROB_DIFF_WARN)


def test_preflight_needs_the_bf16_ref_load_refuses_lora_and_recommends_tis(tmp_path, caplog):
    fp8_dir, bf16_dir = _checkpoint(tmp_path / "fp8", fp8=True), _checkpoint(tmp_path / "bf16", fp8=False)
    with pytest.raises(ValueError, match="FP8 serving checkpoint.*pass them as --ref-load"):
        check_fp8_rollout(_cfg(hf_checkpoint=fp8_dir))
    with pytest.raises(ValueError, match="--lora-rank with an FP8 --hf-checkpoint"):
        check_fp8_rollout(_cfg(hf_checkpoint=fp8_dir, ref_load=bf16_dir, lora_rank=8, train_backend="fsdp"))
    [note] = check_fp8_rollout(_cfg(hf_checkpoint=fp8_dir, ref_load=bf16_dir))
    assert f"BF16 weights from {bf16_dir}" in note and "2x2 blocks" in note and "gate 0.3" in note
    assert "FP8 rollout without --use-tis" in caplog.text
    caplog.clear()
    check_fp8_rollout(_cfg(hf_checkpoint=fp8_dir, ref_load=bf16_dir, use_tis=True))
    assert "--use-tis" not in caplog.text
    assert check_fp8_rollout(_cfg(hf_checkpoint=bf16_dir)) == []


def test_fsdp_converts_a_torch_dist_ref_load_for_fp8_serving_even_without_kl(tmp_path):
    from slime_app.ref_load import fsdp_reference_dir

    fp8_dir = _checkpoint(tmp_path / "fp8", fp8=True)
    torch_dist = tmp_path / "ref_torch_dist"
    torch_dist.mkdir()
    (torch_dist / ".metadata").write_bytes(b"")
    fields = dict(train_backend="fsdp", ref_load=str(torch_dist), output_dir=str(tmp_path / "out"))
    assert not _cfg(hf_checkpoint=fp8_dir, **fields).with_ref
    assert fsdp_reference_dir(_cfg(hf_checkpoint=fp8_dir, **fields), convert=False) == str(
        tmp_path / "out" / "ref_load_hf"
    )
    bf16_dir = _checkpoint(tmp_path / "bf16", fp8=False)
    assert fsdp_reference_dir(_cfg(hf_checkpoint=bf16_dir, **fields), convert=False) is None  # no KL, BF16 serving


def test_preflight_notes_say_the_ref_load_is_the_trainers_start_with_fp8(tmp_path):
    from safetensors.torch import save_file

    from slime_app.checkpoints import check_checkpoints

    fp8_dir = _checkpoint(tmp_path / "fp8", fp8=True)
    bf16_dir = _checkpoint(tmp_path / "bf16", fp8=False)
    save_file({"w": torch.zeros(1)}, str(tmp_path / "bf16" / "model.safetensors"))
    notes = check_checkpoints(_cfg(hf_checkpoint=fp8_dir, ref_load=bf16_dir, train_backend="fsdp"))
    assert f"--ref-load {bf16_dir}: HF weights of the trainer (FP8 serving)" in notes
    # Megatron reads an HF --ref-load too when it holds the BF16 weights of an FP8-serving run.
    notes = check_checkpoints(_cfg(hf_checkpoint=fp8_dir, ref_load=bf16_dir, train_backend="megatron"))
    assert any(n.startswith(f"--ref-load {bf16_dir}: hf") for n in notes)


def _one_weight_bf16(tmp_path, shape: tuple[int, int], module: str = "mlp.up_proj"):
    """A qwen3 HF folder holding one bf16 weight of `shape` (`module`): what the FP8 block checks read."""
    bf16 = tmp_path / "bf16"
    bf16.mkdir()
    (bf16 / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    weight = torch.randn(*shape, dtype=torch.bfloat16)
    save_file({f"model.layers.0.{module}.weight": weight}, str(bf16 / "model.safetensors"))
    return bf16


def test_preflight_refuses_fp8_weights_with_a_partial_column_block(tmp_path):
    # qwen3-tiny (hidden 16) quantized with 128 x 128 blocks: the engine's /weights_checker failed with HTTP 500
    # at the first weight sync; now the preflight names the weight and the fix.
    from slime_convert.fp8 import hf_to_fp8

    # down_proj is no fused part, so SGLang serves its partial column block: only the weight check cannot.
    bf16 = _one_weight_bf16(tmp_path, (16, 64), "mlp.down_proj")
    hf_to_fp8(bf16, tmp_path / "fp8_128", block_size=(128, 128), progress=False)
    fp8 = str(tmp_path / "fp8_128")
    with pytest.raises(ValueError, match=r"128-column block \(first: model.layers.0.mlp.down_proj.weight \[16, 64\]\)"
                                         r".*or pass --no-check-weight-sync$"):  # fmt: skip
        check_fp8_rollout(_cfg(hf_checkpoint=fp8, ref_load=str(bf16), use_tis=True))
    # It refused with the weight check's reason even when the check was off.
    [note] = check_fp8_rollout(_cfg(hf_checkpoint=fp8, ref_load=str(bf16), use_tis=True, check_weight_sync=False))
    assert "128x128 blocks" in note
    hf_to_fp8(bf16, tmp_path / "fp8_16", block_size=(16, 16), progress=False)
    [note] = check_fp8_rollout(_cfg(hf_checkpoint=str(tmp_path / "fp8_16"), ref_load=str(bf16), use_tis=True))
    assert "16x16 blocks" in note


def test_preflight_refuses_a_non_square_fp8_block_while_the_weight_check_is_on(tmp_path):
    # SGLang 0.5.16's /weights_checker (and the reference engine, which answers as it does) infers a square block
    # from the scale's column count, so 32 x 16 blocks failed the first weight sync ("scales cover 32 rows" on a
    # [64, 32] weight) and 16 x 32 ones were compared dequantized with the wrong rows; now the preflight names the
    # checkpoint, its block and the two ways out.
    from slime_convert.fp8 import hf_to_fp8
    from slime_rollout.engines.weight_checksum import sglang_fp8_comparable

    bf16 = _one_weight_bf16(tmp_path, (64, 32))
    hf_to_fp8(bf16, tmp_path / "fp8_32x16", block_size=(32, 16), progress=False)
    q, s = quantize_blockwise(torch.randn(64, 32), (32, 16))
    with pytest.raises(ValueError, match="cover 32 rows"):
        sglang_fp8_comparable(q, s)  # what the weight check would have hit
    fp8 = str(tmp_path / "fp8_32x16")
    with pytest.raises(ValueError, match=r"fp8_32x16/config.json: weight_block_size \[32, 16\] is not square.*"
                                         r"--no-check-weight-sync"):  # fmt: skip
        check_fp8_rollout(_cfg(hf_checkpoint=fp8, ref_load=str(bf16), use_tis=True))
    [note] = check_fp8_rollout(_cfg(hf_checkpoint=fp8, ref_load=str(bf16), use_tis=True, check_weight_sync=False))
    assert "32x16 blocks" in note
