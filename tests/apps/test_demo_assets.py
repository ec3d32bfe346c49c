import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from slime_app import demo
from slime_app.demo import build, task

ROOT = Path(__file__).resolve().parents[2]


def test_splits_deterministic_disjoint_and_correct():
    train, ev = task.generate_splits()
    assert (train, ev) == task.generate_splits()
    assert task.generate_splits(seed=1) != (train, ev)
    assert len(train) == task.NUM_TRAIN and len(ev) == task.NUM_EVAL
    pairs = set()
    for it in train + ev:
        m = re.fullmatch(r"(\d+)\+(\d+)=", it["prompt"])
        assert m, it
        a, b = int(m[1]), int(m[2])
        assert 0 <= a <= task.MAX_OPERAND and 0 <= b <= task.MAX_OPERAND
        assert it["label"] == str(a + b)
        pairs.add((a, b))
    assert len(pairs) == len(train) + len(ev)  # no pair repeated, train and eval disjoint
    # The eval split does not depend on the train size; 2 + 2 fills all 4 pairs of max_operand=1.
    full_train, full_eval = task.generate_splits(num_train=2, num_eval=2, max_operand=1)
    assert full_eval == task.generate_splits(num_train=0, num_eval=2, max_operand=1)[1]
    assert sorted(it["prompt"] for it in full_train + full_eval) == ["0+0=", "0+1=", "1+0=", "1+1="]
    with pytest.raises(ValueError, match="exceeds the 4 distinct"):
        task.generate_splits(num_train=3, num_eval=2, max_operand=1)


def test_write_jsonl_atomic(tmp_path):
    train_path, eval_path = task.write_splits(tmp_path)
    assert [json.loads(x) for x in eval_path.read_text().splitlines()] == task.generate_splits()[1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.jsonl", "train.jsonl"]


def test_committed_data_matches_generator():
    train, ev = task.generate_splits()
    assert [json.loads(x) for x in demo.TRAIN_DATA.read_text().splitlines()] == train
    assert [json.loads(x) for x in demo.EVAL_DATA.read_text().splitlines()] == ev


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(demo.MODEL_DIR)


def test_tokenizer_round_trips_task_text(tok):
    train, ev = task.generate_splits()
    for it in train[:200] + ev:
        text = it["prompt"] + task.make_response(int(it["label"]))
        ids = tok.encode(text)
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text
    assert tok.tokenize("12+7=\\boxed{19}") == ["1", "2", "+", "7", "=", "\\boxed{", "1", "9", "}"]
    assert tok.decode(tok.encode("What is 3 and 4?")) == "What is 3 and 4?"
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id, tok.bos_token) == ("<eos>", 1, 0, None)
    assert len(tok.encode(task.make_response(98))) + 1 == 5  # longest response incl. eos fits max len 8


def test_build_tokenizer_reproduces_committed(tmp_path):
    build.build_tokenizer().save_pretrained(tmp_path)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        assert json.loads((tmp_path / f).read_text()) == json.loads((demo.MODEL_DIR / f).read_text()), f


def test_committed_model_loads_and_answers_in_format(tok):
    files = list(demo.MODEL_DIR.glob("*.safetensors"))
    assert sum(f.stat().st_size for f in files) <= 10 * 2**20
    model = AutoModelForCausalLM.from_pretrained(demo.MODEL_DIR)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.dtype == torch.float32
    ref = build.build_model(tok)
    assert {k: v.shape for k, v in model.state_dict().items()} == {k: v.shape for k, v in ref.state_dict().items()}
    assert model.config.eos_token_id == tok.eos_token_id == model.generation_config.eos_token_id
    _, ev = task.generate_splits()
    tok.padding_side = "left"
    enc = tok([it["prompt"] for it in ev], return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**enc, do_sample=False, max_new_tokens=8)
    texts = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    fmt = sum(bool(re.fullmatch(r"\\boxed\{\d+\}", t)) for t in texts) / len(texts)
    acc = sum(t == task.make_response(int(it["label"])) for t, it in zip(texts, ev, strict=True)) / len(texts)
    assert fmt >= 0.95, texts[:8]
    # Weak but not hopeless: greedy accuracy of the warm-started policy (measured 0.4-0.6 on build).
    assert 0.15 <= acc <= 0.8, acc


def test_sft_batch_masks_prompt(tok):
    batch = build.sft_batch(build.build_tokenizer(), [(12, 7), (3, 4)], rng=__import__("random").Random(0), noise=0)
    # "12+7=" is 5 tokens, "\boxed{", "1", "9", "}", eos = 5 response tokens; row 1 "3+4=" 4 + 4.
    assert batch["input_ids"].shape == (2, 10)
    assert batch["labels"][0].tolist() == [-100] * 5 + tok.encode("\\boxed{19}") + [1]
    assert batch["labels"][1].tolist() == [-100] * 4 + tok.encode("\\boxed{7}") + [1, -100, -100]
    assert batch["attention_mask"].sum(1).tolist() == [10, 8]


def test_sft_two_step_smoke():
    t = build.build_tokenizer()
    model = build.build_model(t, seed=0)
    before = model.model.embed_tokens.weight.detach().clone()
    losses = build.sft(model, t, task.generate_splits()[0], steps=2, batch_size=8)
    assert len(losses) == 2 and all(0 < x < 10 for x in losses)
    assert not torch.equal(before, model.model.embed_tokens.weight)
    model2 = build.build_model(t, seed=0)
    assert torch.equal(before, model2.model.embed_tokens.weight)  # init is seeded


def test_default_demo_argv():
    argv = demo.default_demo_argv("/tmp/x")
    flags = {a: argv[i + 1] if i + 1 < len(argv) else None for i, a in enumerate(argv) if a.startswith("--")}
    assert Path(flags["--hf-checkpoint"]) == demo.MODEL_DIR and demo.MODEL_DIR.is_dir()
    assert Path(flags["--prompt-data"]).is_file()
    assert flags["--eval-prompt-data"] == "demo" and Path(argv[argv.index("--eval-prompt-data") + 2]).is_file()
    assert (flags["--rm-type"], flags["--advantage-estimator"], flags["--train-backend"]) == ("math", "grpo", "fsdp")
    assert (flags["--input-key"], flags["--label-key"]) == ("prompt", "label")
    assert flags["--save"] == "/tmp/x/checkpoints" and "--colocate" in flags
    n = int(flags["--rollout-batch-size"]) * int(flags["--n-samples-per-prompt"])
    assert int(flags["--global-batch-size"]) == n


def test_demo_imports_without_heavy_deps():
    code = (
        "import sys; from slime_app import demo; "
        "print(sorted(m for m in ('ray', 'torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_demo_variants_write_under_their_own_output_dir():
    # `python -m slime_app.demo FLAGS` must not overwrite the plain demo's checkpoints, HF export and curves.
    from slime_app.demo.__main__ import demo_argv
    from slime_core.config import parse_args

    plain = parse_args(demo_argv([]))
    assert (plain.output_dir, plain.save, plain.save_hf) == ("runs/demo", "runs/demo/checkpoints", "runs/demo/hf")
    ppo = parse_args(demo_argv(["--output-dir", "runs/demo-ppo", "--advantage-estimator", "ppo"]))
    assert (ppo.output_dir, ppo.save, ppo.save_hf) == ("runs/demo-ppo", "runs/demo-ppo/checkpoints", "runs/demo-ppo/hf")
    assert ppo.advantage_estimator == "ppo"
    variant = parse_args(demo_argv(["--output-dir=x", "--lr", "4e-3"]))
    assert (variant.save, variant.lr) == ("x/checkpoints", 4e-3)
    assert parse_args(demo_argv(["--lr", "4e-3"])).save == "runs/demo-variant/checkpoints"
