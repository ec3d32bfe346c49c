"""The Megatron backend's first RL step under TP 2, PP 2 (uneven), DP 2 and torch_dist resharding, against one rank.

Two gloo processes (`_layout_worker.py`, megatron-core's own optimizer and schedules) run the layouts one after
another, then one process runs the same step on one rank and loads the TP 2 checkpoint. The models: a 3-layer Qwen3,
and a Qwen2 with tied embeddings (PP 2 keeps a copy on each stage), whose vocabulary (301) no TP size divides, padded
with `--make-vocab-size-divisible-by 1` (301 rows at TP 1, 302 at TP 2). The batch: 6 samples in 2 optimizer steps of
3 (one micro-batch each: 3 per step, not a multiple of DP 2).

Tolerances (fp32 throughout; the layouts only reorder sums): log-probs 2e-6 absolute before the first update; loss
and grad norm 2e-6 absolute or 1e-6 relative; log-probs 1e-5 after two Adam steps (a step moves each weight by about
the learning rate, 1e-3, whatever the gradient's size, so last-bit differences of small gradients show more).
"""

import json
import pathlib
import socket
import subprocess
import sys

import pytest
import torch

pytest.importorskip("megatron.core")

WORKER = pathlib.Path(__file__).with_name("_layout_worker.py")
PP_UNEVEN = ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1",
             "--decoder-last-pipeline-num-layers", "2"]  # fmt: skip
LOSSES = ("train/loss", "train/pg_loss", "train/entropy_loss", "train/pg_clipfrac", "train/ppo_kl", "train/grad_norm")


def _launch(world: int, hf_dir, out: pathlib.Path, scenarios: list[dict]) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [sys.executable, str(WORKER), str(world), str(port), str(hf_dir), str(out), json.dumps(scenarios)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    """`name -> result` of every scenario (see `_layout_worker.py`), and the folder of the checkpoints and exports."""
    transformers = pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("layouts")
    config = transformers.AutoConfig.for_model(
        "qwen3", hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=301, max_position_embeddings=256, rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(1.0, 0.1)
    model.save_pretrained(root / "hf")
    tied = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                vocab_size=301, max_position_embeddings=256, tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(1)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model("qwen2", **tied)).save_pretrained(
        root / "hf-tied"
    )
    ckpt, load = root / "tp2-save", ["--load", str(root / "tp2-save"), "--ckpt-step", "0"]
    _launch(2, root / "hf", root, [
        {"name": "tp2", "flags": ["--tensor-model-parallel-size", "2", "--save", str(ckpt)], "save": True,
         "export": str(root / "export-tp2")},
        {"name": "tp2_sp", "flags": ["--tensor-model-parallel-size", "2", "--sequence-parallel"]},
        {"name": "pp2", "flags": PP_UNEVEN},
        {"name": "dp2", "flags": []},
        {"name": "dp2_dynamic", "cfg": {"use_dynamic_batch_size": True, "max_tokens_per_gpu": 20}},  # < 24, 33 tokens
        {"name": "pp2_per_token", "flags": PP_UNEVEN, "cfg": {"calculate_per_token_loss": True}},
        {"name": "pp2_tied", "flags": PP_UNEVEN, "hf": str(root / "hf-tied")},
        {"name": "pp2_load_tp2", "flags": [*PP_UNEVEN, *load], "export_first": str(root / "export-pp2")},
    ])  # fmt: skip
    _launch(1, root / "hf", root, [
        {"name": "one"},
        {"name": "one_per_token", "cfg": {"calculate_per_token_loss": True}},
        {"name": "one_tied", "hf": str(root / "hf-tied")},
        {"name": "tp1_load_tp2", "flags": load, "export_first": str(root / "export-tp1")},
        {"name": "tp1_finetune", "flags": [*load, "--finetune"]},
        {"name": "tp1_no_load_optim", "flags": [*load, "--no-load-optim", "--no-load-rng"]},
    ])  # fmt: skip
    return {p.stem: torch.load(p, weights_only=False) for p in root.glob("*.pt")}, root


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() == set(range(6))
    return max(float((a[i] - b[i]).abs().max()) for i in a)


@pytest.mark.slow  # two gloo processes and one, each importing megatron-core: ~90 s on 2 cores
@pytest.mark.parametrize(
    ("layout", "one"),
    [("tp2", "one"), ("tp2_sp", "one"), ("pp2", "one"), ("dp2", "one"), ("dp2_dynamic", "one"),
     ("pp2_per_token", "one_per_token"), ("pp2_tied", "one_tied")],
)  # fmt: skip
def test_a_layouts_first_step_is_the_one_rank_step(layouts, layout, one):
    """Log-probs, loss and grad norm as on one rank; rank 0's metrics (what the trainer group returns) are the last
    stage's: at PP 2, rank 0 had no train/loss (slime_core.train_step._step_metrics). TP 2 with --sequence-parallel
    stopped in megatron-core's torch norm ("sequence parallel not supported by torch LayerNorm"; sp_norm.py)."""
    results, _ = layouts
    got, expected = results[layout], results[one]
    assert _max_diff(got["lp"], expected["lp"]) <= 2e-6
    for key in LOSSES:
        assert got["metrics"][key] == pytest.approx(expected["metrics"][key], abs=2e-6, rel=1e-6), key
        assert got["metrics_last"][key] == got["metrics"][key], key
    assert _max_diff(got["after"], expected["after"]) <= 1e-5
    assert got["metrics"]["train/grad_norm"] > 0.1 and abs(got["metrics"]["train/loss"]) > 1e-3  # not vacuous


@pytest.mark.slow
@pytest.mark.parametrize("loaded", ["tp1_load_tp2", "pp2_load_tp2"])
def test_a_tp2_checkpoint_resumes_at_tp1_and_pp2(layouts, loaded):
    """torch_dist resharding: iteration 0 of a TP 2 save (302 embedding rows) loads at TP 1 (301 rows) and at PP 2;
    it was refused ("has 302 rows ..., this run builds 301"). Weights, Adam moments and step count come back: the
    resumed step is the TP 2 run's second step, and the HF exports of the loaded weights are the TP 2 export's bits."""
    results, root = layouts
    from safetensors.torch import load_file

    saved, got = results["tp2"], results[loaded]
    assert got["start"] == 1 and got["adam_steps"] == 2  # --ckpt-step 0: iteration 0 (2 optimizer steps) of 0, 1
    assert _max_diff(got["lp"], saved["after"]) <= 2e-6
    assert _max_diff(saved["after_2"], saved["after"]) > 1e-3  # iteration 1 holds other weights
    for key in LOSSES:
        assert got["metrics"][key] == pytest.approx(saved["metrics_2"][key], abs=2e-6, rel=1e-6), key
    assert _max_diff(got["after"], saved["after_2"]) <= 1e-5
    exported = load_file(root / "export-tp2" / "model.safetensors")
    loaded_export = load_file(root / f"export-{loaded[:3]}" / "model.safetensors")
    assert loaded_export.keys() == exported.keys() and exported["model.embed_tokens.weight"].shape[0] == 301
    for name, tensor in exported.items():
        assert torch.equal(loaded_export[name], tensor), name


@pytest.mark.slow
def test_finetune_and_no_load_optim_take_the_weights_only(layouts):
    """`--finetune`: rollout 0, fresh Adam; `--no-load-optim --no-load-rng`: the next rollout, fresh Adam."""
    results, _ = layouts
    saved = results["tp2"]
    for name, start in (("tp1_finetune", 0), ("tp1_no_load_optim", 1)):
        got = results[name]
        assert got["start"] == start and got["adam_steps"] == 0, name
        assert _max_diff(got["lp"], saved["after"]) <= 2e-6, name
