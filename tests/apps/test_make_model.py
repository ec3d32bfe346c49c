import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer

import slime_make_model as mm

ROOT = Path(__file__).resolve().parents[2]

FIXTURE = ROOT / "tests" / "fixtures" / "qwen3-tokenizer"


def reference_param_count(h, layers, heads, kv, inter, tie, vocab=151936, hd=128):
    """Independent count from the Qwen3 architecture: q/k/v/o, q/k RMSNorm, SwiGLU MLP, 2 layer norms."""
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 2 * hd
    mlp = 3 * h * inter
    per_layer = attn + mlp + 2 * h
    return layers * per_layer + vocab * h * (1 if tie else 2) + h


@pytest.mark.parametrize(
    "name,shape,nominal",
    [
        ("qwen3-0.6b", (1024, 28, 16, 8, 3072, True), 0.6e9),
        ("qwen3-1.7b", (2048, 28, 16, 8, 6144, True), 1.7e9),
        ("qwen3-4b", (2560, 36, 32, 8, 9728, True), 4.0e9),
        ("qwen3-8b", (4096, 36, 32, 8, 12288, False), 8.2e9),
    ],
)
def test_preset_shapes_and_param_counts(name, shape, nominal):
    cfg = mm.preset_config(name)
    h, layers, heads, kv, inter, tie = shape
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.num_attention_heads) == (h, layers, heads)
    assert (cfg.num_key_value_heads, cfg.intermediate_size, cfg.tie_word_embeddings) == (kv, inter, tie)
    assert cfg.head_dim == 128 and cfg.rope_parameters["rope_theta"] == 1e6 and cfg.vocab_size == 151936
    n = mm.count_parameters(cfg)  # meta device: no allocation
    assert n == reference_param_count(h, layers, heads, kv, inter, tie)
    assert abs(n - nominal) / nominal < 0.05, n


def test_unknown_preset_and_dtype_raise():
    with pytest.raises(ValueError, match="--preset"):
        mm.preset_config("qwen3-3b")
    with pytest.raises(ValueError, match="--dtype"):
        mm.preset_config("qwen3-tiny", dtype="int8")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mm") / "tiny"
    mm.make_model("qwen3-tiny", out, dtype="float32", seed=3)
    return out


def test_tiny_loads_with_real_qwen3_tokenizer(tiny_dir):
    assert (tiny_dir / "model.safetensors").stat().st_size < 16 * 2**20
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert (tiny_dir / f).read_bytes() == (FIXTURE / f).read_bytes()
    tok = AutoTokenizer.from_pretrained(tiny_dir)
    assert len(tok) == 151669 and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "1+1?"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\n1+1?<|im_end|>\n<|im_start|>assistant\n"
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert model.config.architectures == ["Qwen3ForCausalLM"] and model.dtype == torch.float32
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    emb = model.model.embed_tokens.weight
    assert emb.shape == (151936, 16)
    assert abs(emb.std().item() - 0.02) < 0.001  # N(0, 0.02^2) over 2.4 M draws
    assert torch.equal(model.model.norm.weight, torch.ones(16))
    ids = tok("hello", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=3, do_sample=False)
    assert out.shape == (1, ids["input_ids"].shape[1] + 3)
    gen = json.loads((tiny_dir / "generation_config.json").read_text())
    assert gen["eos_token_id"] == [151645, 151643]


def test_moe_tiny_preset_is_a_routing_qwen3_moe(tmp_path):
    # The MoE preset routing replay needs on CPU: a Qwen3-MoE (8 experts, top-2, renormalized) that HF loads,
    # whose routers are drawn wider than the other weights so that routes depend on the token.
    cfg = mm.preset_config("qwen3-moe-tiny")
    assert type(cfg).__name__ == "Qwen3MoeConfig"
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size, cfg.norm_topk_prob) == (8, 2, 32, True)
    h, layers, heads, kv, hd, experts, inter = 64, 2, 4, 2, 16, 8, 32
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 2 * hd
    moe = experts * 3 * h * inter + experts * h  # SwiGLU experts + router [experts, hidden]
    assert mm.count_parameters(cfg) == layers * (attn + moe + 2 * h) + 151936 * h + h
    out = mm.make_model("qwen3-moe-tiny", tmp_path / "moe", dtype="float32", seed=0)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.architectures == ["Qwen3MoeForCausalLM"]
    router = model.model.layers[0].mlp.gate.weight
    assert router.shape == (8, 64)
    assert abs(router.std().item() - 0.5) < 0.1  # N(0, 0.5^2) over 512 draws
    assert abs(model.model.layers[0].self_attn.q_proj.weight.std().item() - 0.02) < 0.002
    hidden = model.model.embed_tokens(torch.arange(0, 4000, 40))  # 100 tokens
    routes = {tuple(sorted(r)) for r in torch.topk(hidden @ router.T, 2).indices.tolist()}
    assert len(routes) >= 8, routes  # of the 28 pairs of experts, the tokens use many
    # Stored as a published Qwen3-MoE checkpoint is: one matrix per expert (transformers 5 fuses them in memory
    # only). Written fused, slime's shape check refused the preset the README points to for routing replay.
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_slice("model.layers.1.mlp.experts.7.gate_proj.weight").get_shape() == [32, 64]
        assert f.get_slice("model.layers.1.mlp.experts.7.down_proj.weight").get_shape() == [64, 32]
    assert not any(n.endswith(("experts.gate_up_proj", "experts.down_proj")) for n in names)
    assert sum(".mlp.experts." in n for n in names) == 2 * 8 * 3
    from slime_convert.load_shapes import check_hf_checkpoint
    from slime_convert.model_args import ModelArgs

    check_hf_checkpoint("--hf-checkpoint", out, ModelArgs.from_hf_dir(out), config_dir=out)  # what a run checks


def test_sharded_output_equals_single_file(tiny_dir, tmp_path):
    out = mm.make_model("qwen3-tiny", tmp_path / "sharded", dtype="float32", seed=3, max_shard_gb=1e-5)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) >= 3 and shards[0].endswith(f"-of-{len(shards):05d}.safetensors")
    with safe_open(str(tiny_dir / "model.safetensors"), "pt") as single:
        assert set(single.keys()) == set(index["weight_map"])
        for name, shard in index["weight_map"].items():
            with safe_open(str(out / shard), "pt") as f:
                assert torch.equal(f.get_tensor(name), single.get_tensor(name)), name
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.model.layers[1].mlp.down_proj.weight.shape == (16, 64)
    # Every shard readable like the config next to it (safetensors >= 0.8 alone writes 0600; umask 022 here).
    previous = os.umask(0o022)
    try:
        again = mm.make_model("qwen3-tiny", tmp_path / "modes", dtype="float32", seed=3, max_shard_gb=1e-5)
    finally:
        os.umask(previous)
    config_mode = stat.S_IMODE((again / "config.json").stat().st_mode)
    assert config_mode == 0o644
    assert {stat.S_IMODE(p.stat().st_mode) for p in again.glob("*.safetensors")} == {config_mode}


def test_bf16_and_existing_out(tmp_path):
    out = mm.make_model("qwen3-tiny", tmp_path / "bf", dtype="bfloat16", seed=0)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.bfloat16
    with pytest.raises(FileExistsError, match="--out"):
        mm.make_model("qwen3-tiny", out)
    assert not any(p.name.startswith(".bf.") for p in tmp_path.iterdir())  # no temp dir left behind


def test_cli(tmp_path):
    out = tmp_path / "cli"
    r = subprocess.run(
        [sys.executable, str(ROOT / "apps" / "make_model"), "--preset", "qwen3-tiny", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    r = subprocess.run(
        [sys.executable, str(ROOT / "apps" / "make_model"), "--preset", "nope", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2 and "--preset" in r.stderr


def test_help_starts_without_torch():
    code = (
        "import sys\nfrom slime_make_model.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "--preset" in r.stdout and r.stdout.splitlines()[-1] == "False False"
