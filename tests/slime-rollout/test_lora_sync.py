"""LoRA on the engine side: the reference engine serves base + adapter, `LoraWeightUpdater` moves only the adapter.

The adapter is random A and B under PEFT names; the expected log-probs are the base model's forward with
`W + (alpha/r)·B A` merged in by hand (fp32, tolerance 1e-5 as for the base engine). The files `write_adapter`
writes are also read back as SGLang 0.5.16 reads them (`_sglang_lora_reader.py`, against the flags our launcher
gives SGLang), and the launcher's colocated LoRA engines keep their base weights across a memory release.
"""

import asyncio
import importlib.util
import json
import pathlib
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM

from slime_core.config import SlimeArgs
from slime_core.lora import LORA_NAME
from slime_rollout.engines.client import EngineClient, EngineError, RolloutClient
from slime_rollout.engines.launch import build_sglang_command, lora_server_args, needs_weights_backup
from slime_rollout.weight_sync.lora import LoraWeightUpdater, write_adapter

LOGPROB_ATOL = 1e-5
PROMPT = [785, 4226, 374, 220, 17, 10, 17, 28]
TARGETS = ["q_proj", "v_proj", "down_proj"]
ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # the flag's default
_spec = importlib.util.spec_from_file_location("sglang_lora_reader", pathlib.Path(__file__).with_name(
    "_sglang_lora_reader.py"))  # fmt: skip
SGL = sys.modules.setdefault(_spec.name, importlib.util.module_from_spec(_spec))  # dataclasses look it up there
_spec.loader.exec_module(SGL)


def _cfg(**fields):
    base = {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "fsdp", "lora_rank": 4, "lora_alpha": 8.0,
            "lora_target_modules": TARGETS}  # fmt: skip
    return SlimeArgs.from_dict({**base, **fields})


def _adapter(base_dir, seed, targets=TARGETS):
    """Random (non-zero) A and B for every target module of the tiny Qwen3, as PEFT-named buckets, and the
    reference: the base model with `W + (alpha/r)·B A` merged in by hand (no peft involved)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    bucket = []
    with torch.no_grad():
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.split(".")[-1] in targets:
                a = torch.randn(4, module.in_features) * 0.1
                b = torch.randn(module.out_features, 4) * 0.1
                bucket += [(f"base_model.model.{name}.lora_A.weight", a), (f"base_model.model.{name}.lora_B.weight", b)]
                module.weight += (8.0 / 4) * (b @ a)
    return [bucket], model


def _expected(model, output_ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([PROMPT + output_ids])).logits[0, len(PROMPT) - 1 : -1]
    return torch.log_softmax(logits.float(), -1)[torch.arange(len(output_ids)), torch.tensor(output_ids)]


async def _greedy(client, **extra):
    out = await client.generate(
        {
            "input_ids": PROMPT,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 5, "ignore_eos": True},
            "return_logprob": True,
            **extra,
        }  # fmt: skip
    )
    return out["output_ids"], torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])


def test_sglang_command_enables_lora():
    cmd = build_sglang_command(_cfg(), host="h", port=1, nccl_port=2, tp_size=1, base_gpu_id=0, random_seed=3,
                               memory_saver=False, python="py")  # fmt: skip
    i = cmd.index("--enable-lora")
    assert cmd[i : i + 9] == ["--enable-lora", "--max-lora-rank", "4", "--lora-target-modules", *TARGETS,
                              "--max-loras-per-batch", "1"]  # fmt: skip
    assert lora_server_args(_cfg().model_copy(update={"lora_rank": 0})) == []
    assert "--max-lora-rank" not in lora_server_args(_cfg(), ["--max-lora-rank=8"])  # a pass-through flag wins
    assert "--enable-weights-cpu-backup" not in cmd  # not colocated: the engine never releases its weights


def test_colocated_lora_engine_backs_up_its_base_weights():
    # SGLang's /release_memory_occupation drops the weights' GPU memory and /resume_memory_occupation maps fresh
    # (in practice zeroed) memory, unless --enable-weights-cpu-backup. A LoRA sync pushes only the adapter, so a
    # colocated LoRA engine without the backup served the adapter on a zeroed base model: every logit 0, every
    # log-prob -log(V). Against a random-init Qwen3-0.6B (logits ~ N(0, 1024 · 0.02²)) that is the mean
    # |trainer - rollout log-prob| of 0.536 measured by e2e_lora on an H200.
    cmd = build_sglang_command(_cfg(), host="h", port=1, nccl_port=2, tp_size=1, base_gpu_id=0, random_seed=3,
                               memory_saver=True, python="py")  # fmt: skip
    assert "--enable-memory-saver" in cmd and "--enable-weights-cpu-backup" in cmd
    full = _cfg(lora_rank=0, weight_sync="auto")  # a full sync rewrites every weight after each resume
    no_lora = build_sglang_command(full, host="h", port=1, nccl_port=2, tp_size=1, base_gpu_id=0, random_seed=3,
                                   memory_saver=True, python="py")  # fmt: skip
    assert "--enable-weights-cpu-backup" not in no_lora
    # --freeze-vision-tower pushes the frozen tower on the first sync only: the same hole.
    assert needs_weights_backup(full.model_copy(update={"freeze_vision_tower": True}), memory_saver=True)
    assert not needs_weights_backup(_cfg(), memory_saver=False)
    # A pass-through flag of the same name is not doubled.
    passthrough = _cfg(sglang_args={"enable_weights_cpu_backup": True})
    doubled = build_sglang_command(passthrough, host="h", port=1, nccl_port=2, tp_size=1, base_gpu_id=0,
                                   random_seed=3, memory_saver=True, python="py")  # fmt: skip
    assert doubled.count("--enable-weights-cpu-backup") == 1


@pytest.mark.slow  # several engine processes (10-30 s): the full CI pass runs it
def test_reference_engine_loses_released_weights_as_sglang(reference_args, tiny_qwen3_dir, private_tmp):
    """The CPU stand-in behaves as SGLang on release/resume: without the backup the weights come back zeroed, so a
    colocated LoRA run on CPU fails its checks as it did on the GPU; the launcher gives it the backup."""
    import asyncio

    from slime_rollout.engines.client import EngineClient
    from slime_rollout.engines.launch import build_reference_command, launch_engines

    full = reference_args(tiny_qwen3_dir)
    assert "--enable-weights-cpu-backup" not in build_reference_command(
        full, host="h", port=1, random_seed=0, memory_saver=True)  # fmt: skip
    lora = reference_args(tiny_qwen3_dir, train_backend="fsdp", lora_rank=4, lora_alpha=8.0,
                          update_weight_disk_dir=str(private_tmp / "lora-backup"))  # fmt: skip
    assert "--enable-weights-cpu-backup" in build_reference_command(
        lora, host="h", port=1, random_seed=0, memory_saver=True)  # fmt: skip

    async def greedy_after_release(url):
        engine = EngineClient(url, timeout=60)
        try:
            body = {"input_ids": [785, 4226, 374], "sampling_params": {"temperature": 0.0, "max_new_tokens": 3,
                    "ignore_eos": True}, "return_logprob": True}  # fmt: skip
            before = (await engine.generate(body))["meta_info"]["output_token_logprobs"]
            await engine.request("POST", "/release_memory_occupation", {})
            await engine.request("POST", "/resume_memory_occupation", {"tags": ["weights"]})
            after = (await engine.generate(body))["meta_info"]["output_token_logprobs"]
            return [e[0] for e in before], [e[0] for e in after]
        finally:
            await engine.aclose()

    for cfg, kept in ((full, False), (lora, True)):
        with launch_engines(cfg, num_engines=1, gpus_per_engine=1, colocate=True, startup_timeout_s=300,
                            log_dir=private_tmp / "backup-logs") as group:  # fmt: skip
            before, after = asyncio.run(greedy_after_release(group.urls[0]))
        assert (before == after) is kept
        if not kept:  # a zeroed model: uniform over the vocabulary
            assert all(abs(lp + 11.931) < 1e-3 for lp in after), after


@pytest.mark.parametrize("targets", [TARGETS, ALL_TARGETS], ids=["q-v-down", "default-targets"])
def test_written_adapter_as_sglang_reads_it_is_the_synced_model(tiny_qwen3_dir, tmp_path, targets):
    """`write_adapter` (what `LoraWeightUpdater` sends) read by SGLang's rules under the launcher's flags gives the
    model the buckets describe: names, stacking (q/k/v with a zero k, gate/up), scale alpha/r (fp32, 1e-5)."""
    cfg = _cfg(hf_checkpoint=str(tiny_qwen3_dir), lora_target_modules=targets)
    buckets, expected_model = _adapter(tiny_qwen3_dir, 5, targets)
    write_adapter(cfg, buckets, tmp_path / "lora_v1")
    cmd = build_sglang_command(cfg, host="h", port=1, nccl_port=2, tp_size=1, base_gpu_id=0, random_seed=3,
                               memory_saver=True, python="py")  # fmt: skip
    max_rank, server_targets = SGL.server_flags(cmd)
    adapter = SGL.read_like_sglang(tmp_path / "lora_v1", max_lora_rank=max_rank, target_modules=server_targets)
    assert adapter.rank == 4 and adapter.scaling == 8.0 / 4
    served = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    linears = {n: m for n, m in served.named_modules() if isinstance(m, torch.nn.Linear)}
    deltas = SGL.delta_weights(adapter, {n: m.out_features for n, m in linears.items()})
    adapted = {n for n, d in deltas.items() if d.abs().max() > 0}
    assert {n.split(".")[-1] for n in adapted} == set(targets)
    with torch.no_grad():
        for name, delta in deltas.items():
            linears[name].weight += delta
    ids = [17, 10, 3, 900, 42]
    torch.testing.assert_close(_expected(served, ids), _expected(expected_model, ids), atol=LOGPROB_ATOL, rtol=0)
    config = json.loads((tmp_path / "lora_v1" / "adapter_config.json").read_text())
    assert (config["use_rslora"], config["use_dora"]) == (False, False)  # SGLang scales by alpha / r, no DoRA


def test_write_adapter_never_replaces_a_folder_slime_did_not_write(tiny_qwen3_dir, tmp_path):
    from slime_core.dir_swap import ReplaceRefused

    cfg = _cfg(hf_checkpoint=str(tiny_qwen3_dir))
    user = tmp_path / "lora_v000001"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    with pytest.raises(ReplaceRefused, match=f"--update-weight-disk-dir {user}: is a non-empty folder"):
        write_adapter(cfg, [[("x.lora_A.weight", torch.zeros(1))]], user)
    assert [p.name for p in tmp_path.iterdir()] == ["lora_v000001"] and (user / "notes.txt").read_text() == "mine"


def test_sglang_reader_refuses_what_sglang_refuses_or_skips(tiny_qwen3_dir, tmp_path):
    cfg = _cfg(hf_checkpoint=str(tiny_qwen3_dir))
    buckets, _ = _adapter(tiny_qwen3_dir, 6)
    write_adapter(cfg, buckets, tmp_path / "a")
    with pytest.raises(ValueError, match="not supported"):  # rank above --max-lora-rank
        SGL.read_like_sglang(tmp_path / "a", max_lora_rank=2, target_modules=TARGETS)
    with pytest.raises(ValueError, match="not supported"):  # a target module the server was not started with
        SGL.read_like_sglang(tmp_path / "a", max_lora_rank=4, target_modules=["q_proj", "v_proj"])
    renamed = [[(n.replace("base_model.model.model.", "model."), t) for n, t in buckets[0]]]
    write_adapter(cfg, renamed, tmp_path / "b")  # no PEFT prefix: still found by layer id and module name
    SGL.read_like_sglang(tmp_path / "b", max_lora_rank=4, target_modules=TARGETS)
    only_v = [[(n, t) for n, t in buckets[0] if ".v_proj." in n]]
    write_adapter(cfg, only_v, tmp_path / "c")  # v without q is never stacked into qkv_proj: SGLang skips it
    with pytest.raises(ValueError, match="matches no --lora-target-modules"):
        SGL.read_like_sglang(tmp_path / "c", max_lora_rank=4, target_modules=TARGETS)


@pytest.mark.slow  # several engine processes (10-30 s): the full CI pass runs it
def test_reference_engine_serves_base_and_adapter_and_updater_moves_only_adapter(
    reference_engine, tiny_qwen3_dir, tmp_path
):
    url = reference_engine.urls[0]
    base = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    (first_buckets, first), (second_buckets, second) = _adapter(tiny_qwen3_dir, 1), _adapter(tiny_qwen3_dir, 2)
    cfg = _cfg(hf_checkpoint=str(tiny_qwen3_dir), update_weight_disk_dir=str(tmp_path / "sync"))
    updater = LoraWeightUpdater(cfg, RolloutClient([url]))

    async def scenario():
        plain = RolloutClient([url])
        adapted = RolloutClient([url], lora_name=LORA_NAME)  # what get_client(args) builds with --lora-rank
        with pytest.raises(EngineError, match="never been loaded"):
            await _greedy(adapted)
        await updater.aupdate(first_buckets, "1")
        assert await plain.get_weight_versions() == ["1"]
        # Concurrent base and adapter requests: each batch runs one adapter, each reply its own model's numbers.
        (ids_a, lp_a), (ids_b, lp_b) = await asyncio.gather(_greedy(adapted), _greedy(plain))
        await updater.aupdate(second_buckets, "2")
        ids_c, lp_c = await _greedy(adapted)
        loaded = await EngineClient(url).unload_lora_adapter(LORA_NAME)
        await EngineClient(url).update_weight_version("default")  # the engine is shared with other test modules
        for c in (plain, adapted):
            await c.aclose()
        return (ids_a, lp_a), (ids_b, lp_b), (ids_c, lp_c), loaded

    (ids_a, lp_a), (ids_b, lp_b), (ids_c, lp_c), loaded = asyncio.run(scenario())
    torch.testing.assert_close(lp_a, _expected(first, ids_a), atol=LOGPROB_ATOL, rtol=0)
    torch.testing.assert_close(lp_b, _expected(base, ids_b), atol=LOGPROB_ATOL, rtol=0)
    torch.testing.assert_close(lp_c, _expected(second, ids_c), atol=LOGPROB_ATOL, rtol=0)
    assert not torch.allclose(lp_a, lp_b)  # the adapter changes the model
    assert loaded["loaded_adapters"] == {}
    # Only the newest adapter directory is kept; it holds the adapter files only (no base weights).
    assert [p.name for p in (tmp_path / "sync").iterdir()] == ["lora_v000002"]
    files = sorted(p.name for p in (tmp_path / "sync" / "lora_v000002").iterdir())
    assert files == [".slime_export", "adapter_config.json", "adapter_model.safetensors"]  # + slime's marker


def test_validation_resolves_and_guards_lora_sync():
    cfg = _cfg()
    assert cfg.weight_sync == "lora" and cfg.update_weight_disk_dir.endswith("weight_sync")
    with pytest.raises(ValueError, match=r"--lora-rank needs a LoRA backend \(--train-backend fsdp.*\), got megatron"):
        _cfg(train_backend="megatron")
    with pytest.raises(ValueError, match="with --lora-rank only the adapter is synced"):
        _cfg(weight_sync="tensor")
    with pytest.raises(ValueError, match="--weight-sync lora syncs a LoRA adapter"):
        _cfg(lora_rank=0, weight_sync="lora")


def test_reference_engine_scales_and_refuses_as_sglang(tiny_qwen3_dir, tmp_path):
    from slime_rollout.engines.reference.lora import LoraAdapters

    cfg = _cfg(hf_checkpoint=str(tiny_qwen3_dir))
    buckets, expected_model = _adapter(tiny_qwen3_dir, 7)  # merged with alpha / r = 2
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen3_dir, dtype=torch.float32).eval()
    adapters = LoraAdapters(model)
    for flag in ("use_rslora", "use_dora"):
        write_adapter(cfg, buckets, tmp_path / flag)
        config_path = tmp_path / flag / "adapter_config.json"
        config_path.write_text(json.dumps({**json.loads(config_path.read_text()), flag: True}))
    adapters.load("rs", str(tmp_path / "use_rslora"))  # SGLang never reads use_rslora: alpha / r, not alpha / √r
    adapters.active = "rs"
    ids = [17, 10, 3, 900, 42]
    torch.testing.assert_close(_expected(model, ids), _expected(expected_model, ids), atol=LOGPROB_ATOL, rtol=0)
    with pytest.raises(ValueError, match="DoRA"):
        adapters.load("dora", str(tmp_path / "use_dora"))


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        (
            {"lora_target_modules": ["q_proj"]},
            "--lora-target-modules q_proj without v_proj: SGLang fails to load the "
            "adapter (a KeyError on v_proj); add v_proj",
        ),
        (
            {"lora_target_modules": ["v_proj", "o_proj"]},
            "--lora-target-modules v_proj without q_proj: SGLang skips the "
            "v_proj tensors: the engine serves the base v_proj; add q_proj",
        ),
        (
            {"lora_target_modules": ["up_proj"]},
            "--lora-target-modules up_proj without gate_proj: SGLang skips the "
            "up_proj tensors: the engine serves the base up_proj; add gate_proj",
        ),
        (
            {"sglang_args": {"max_lora_rank": "2"}},
            "--sglang-max-lora-rank 2 < --lora-rank 4: SGLang refuses the adapter",
        ),
        (
            {"sglang_args": {"lora_target_modules": ["q_proj", "o_proj"]}},
            "--sglang-lora-target-modules q_proj o_proj "
            "lacks some of --lora-target-modules q_proj "
            "v_proj down_proj: SGLang refuses the adapter",
        ),
    ],
    ids=["q-without-v", "v-without-q", "up-without-gate", "passthrough-rank", "passthrough-targets"],
)
def test_sglang_preflight_refuses_an_adapter_sglang_would_not_serve(tiny_qwen3_dir, tmp_path, fields, problem):
    """Found before the engines start: each fault surfaced at the first weight sync, or (a skipped tensor) never."""
    from slime_core.extensions import engine_spec

    cfg = _cfg(rollout_engine="sglang", **fields)
    assert [p.message for p in engine_spec(cfg).check(cfg)] == [problem]
    if "lora_target_modules" in fields and "sglang_args" not in fields:  # what SGLang's reader does with the files
        buckets, _ = _adapter(tiny_qwen3_dir, 8, fields["lora_target_modules"])
        write_adapter(_cfg(hf_checkpoint=str(tiny_qwen3_dir), **fields), buckets, tmp_path / "a")
        with pytest.raises((ValueError, KeyError)):
            SGL.read_like_sglang(tmp_path / "a", max_lora_rank=4, target_modules=fields["lora_target_modules"])


def test_sglang_preflight_passes_what_sglang_serves():
    from slime_core.extensions import engine_spec

    for fields in ({}, {"lora_target_modules": ["q_proj", "v_proj"]},
                   {"lora_target_modules": ["q_proj", "k_proj", "v_proj", "gate_proj"]},
                   {"sglang_args": {"lora_target_modules": "all", "max_lora_rank": "64"}}):  # fmt: skip
        cfg = _cfg(rollout_engine="sglang", **fields)
        assert engine_spec(cfg).check(cfg) == [], fields
    # External servers: their flags are not checked, the stacking still is.
    ext = _cfg(rollout_engine="sglang", rollout_engine_urls=["http://h:1"], sglang_args={"max_lora_rank": "2"})
    assert engine_spec(ext).check(ext) == []
