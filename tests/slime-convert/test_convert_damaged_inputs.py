"""`slime-convert` against damaged or malformed inputs: one error naming the file (exit 2), nothing written."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from slime_convert import hf_to_mcore, mcore_to_hf
from slime_convert.cli import main
from slime_convert.hf_io import HFCheckpointReader

pytest.importorskip("transformers")


@pytest.mark.parametrize("keep", [5, 0.5])  # inside the 8-byte header length / inside the tensor data
def test_a_truncated_shard_is_one_error_naming_the_file(first_shard, tiny_hf_model, tmp_path, caplog, keep):
    _, hf_dir = tiny_hf_model("qwen3")
    broken = shutil.copytree(hf_dir, tmp_path / "broken")
    shard = first_shard(broken)
    data = shard.read_bytes()
    shard.write_bytes(data[: keep if isinstance(keep, int) else int(len(data) * keep)])
    # Was safetensors' SafetensorError traceback, naming no file.
    with pytest.raises(ValueError, match=f"{shard.name}: not a complete safetensors file"):
        HFCheckpointReader(broken)
    argv = ["hf-to-mcore", "--hf-checkpoint", str(broken), "--save", str(tmp_path / "m"), "--no-progress"]
    assert main(argv) == 2
    assert f"{shard}: not a complete safetensors file" in caplog.text
    assert not (tmp_path / "m" / "release").exists()


def test_a_broken_index_names_the_index_file(tiny_hf_model, tmp_path):
    _, hf_dir = tiny_hf_model("qwen3")
    broken = shutil.copytree(hf_dir, tmp_path / "broken")
    index = broken / "model.safetensors.index.json"
    good = json.loads(index.read_text())
    for text, message in [
        ("{", "not a safetensors index"),  # was json's 'Expecting property name ...' naming no file
        ("{}", "no 'weight_map' object"),  # was the bare KeyError "'weight_map'"
        ("[]", "not a safetensors index"),
    ]:
        index.write_text(text)
        with pytest.raises(ValueError, match=f"{index}: {message}"):
            HFCheckpointReader(broken)
    # The index puts a tensor into a shard that does not hold it: named when the index is read, not at first use.
    name = next(iter(good["weight_map"]))
    other = next(f for f in sorted(set(good["weight_map"].values())) if f != good["weight_map"][name])
    index.write_text(json.dumps({**good, "weight_map": {**good["weight_map"], name: other}}))
    with pytest.raises(ValueError, match=f"names \\['{name}'\\] in {other}, which does not hold them"):
        HFCheckpointReader(broken)


def test_a_damaged_tracker_file_is_named(tiny_hf_model, tmp_path, caplog):
    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    (tmp_path / "m" / "latest_checkpointed_iteration.txt").write_text("garb\x00age")
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    assert main([*argv, "--origin-hf-dir", str(hf_dir), "--no-progress"]) == 2
    # Was "invalid literal for int() with base 10: 'garbage'", naming no file.
    expected = "latest_checkpointed_iteration.txt: holds 'garb\\x00age', not an iteration number or 'release'"
    assert expected in caplog.text


@pytest.mark.parametrize("part", ["shard", "metadata"])
def test_a_damaged_torch_dist_checkpoint_is_one_error_naming_it(tiny_hf_model, tmp_path, caplog, part):
    _, hf_dir = tiny_hf_model("qwen3")
    release = hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    damaged = next(release.glob("*.distcp")) if part == "shard" else release / ".metadata"
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 2])  # a partial copy
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    # Was DCP's CheckpointException (a BaseException, a rank traceback) / pickle's UnpicklingError naming no file.
    assert main([*argv, "--origin-hf-dir", str(hf_dir), "--no-progress"]) == 2
    expected = {
        "shard": f"{release}: cannot be read (RuntimeError: PytorchStreamReader failed reading zip archive",
        "metadata": f"{release / '.metadata'}: not readable torch_dist metadata (UnpicklingError",
    }[part]
    assert expected in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


@pytest.mark.parametrize("how", ["parent", "absolute"])
def test_an_index_naming_a_shard_outside_the_checkpoint_is_refused(tiny_hf_model, tmp_path, caplog, how):
    # Issue 27: the reader joined the folder with the index's name as given, so `../x` or `/x` read a real
    # safetensors file elsewhere on the machine (here: one of the same model, so nothing else stopped it).
    _, hf_dir = tiny_hf_model("qwen3")
    model = shutil.copytree(hf_dir, tmp_path / "models" / "m")
    index = model / "model.safetensors.index.json"
    good = json.loads(index.read_text())
    name, shard = next(iter(good["weight_map"].items()))
    outside = tmp_path / "models" / shard
    shutil.copy(model / shard, outside)  # a complete file that holds the tensor: only the name is wrong
    file = f"../{shard}" if how == "parent" else str(outside)
    index.write_text(json.dumps({**good, "weight_map": {**good["weight_map"], name: file}}))
    why = "leads out of the folder ('..')" if how == "parent" else "is not a file name inside the folder"
    message = f"{index}: weight_map[{name!r}] = {file!r} {why}"
    with pytest.raises(ValueError) as e:
        HFCheckpointReader(model)
    assert str(e.value) == message
    argv = ["hf-to-mcore", "--hf-checkpoint", str(model), "--save", str(tmp_path / "out"), "--no-progress"]
    assert main(argv) == 2
    assert message in caplog.text and not (tmp_path / "out").exists()


def test_a_dangling_link_in_the_origin_dir_is_named_before_writing(tiny_hf_model, tmp_path, caplog):
    """A tokenizer.json linking into a pruned HF cache was skipped without a word: the export had no tokenizer."""
    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_mcore(hf_dir, tmp_path / "m", progress=False)
    origin = tmp_path / "linked"
    origin.mkdir()
    for f in hf_dir.iterdir():
        (origin / f.name).symlink_to(f)  # the HF cache's snapshot layout: every file a link
    (origin / "tokenizer.json").symlink_to(tmp_path / "blobs" / "gone")
    argv = ["mcore-to-hf", "--input-dir", str(tmp_path / "m"), "--output-dir", str(tmp_path / "h")]
    assert main([*argv, "--origin-hf-dir", str(origin), "--no-progress"]) == 2
    assert f"--origin-hf-dir {origin}: ['tokenizer.json'] are links to missing files" in caplog.text
    assert not (tmp_path / "h").exists() and not (tmp_path / "h.tmp").exists()
    (origin / "tokenizer.json").unlink()
    out = mcore_to_hf(tmp_path / "m", tmp_path / "h", origin, progress=False)  # linked shards and config are read
    assert (out / "config.json").is_file() and not (out / "config.json").is_symlink()


@pytest.mark.parametrize("given", ["root", "iteration"])
def test_the_legacy_per_rank_layout_is_named(tiny_hf_model, tmp_path, caplog, given):
    """A TP=2 `--ckpt-format torch` save (mp_rank_00/, mp_rank_01/) was "not a torch_dist checkpoint directory"."""
    _, hf_dir = tiny_hf_model("qwen3")
    iteration = tmp_path / "save" / "iter_0000010"
    for rank in ("mp_rank_00", "mp_rank_01"):
        (iteration / rank).mkdir(parents=True)
        torch.save({"model": {}}, iteration / rank / "model_optim_rng.pt")
    (tmp_path / "save" / "latest_checkpointed_iteration.txt").write_text("10")
    given_dir = tmp_path / "save" if given == "root" else iteration
    argv = ["mcore-to-hf", "--input-dir", str(given_dir), "--output-dir", str(tmp_path / "h")]
    assert main([*argv, "--origin-hf-dir", str(hf_dir), "--no-progress"]) == 2
    assert f"{iteration}: a legacy --ckpt-format torch checkpoint (2 rank folders: mp_rank_00, ...)" in caplog.text
    assert "--ckpt-convert-format torch_dist" in caplog.text and not (tmp_path / "h").exists()


@pytest.mark.parametrize("given", ["root", "iteration", "model_and_optim"])
def test_an_fsdp_checkpoint_is_named_as_one(tiny_hf_model, tmp_path, caplog, given):
    """An FSDP trainer's save was "not a torch_dist checkpoint directory" (root, iteration), or its DCP folder was
    read as torch_dist and failed on the first Megatron name it lacked."""
    import torch.distributed.checkpoint as dcp

    model, hf_dir = tiny_hf_model("qwen3")
    # slime_train_fsdp.checkpoint's layout: iter_<n>/model_and_optim (DCP of {"model": HF state dict}), meta.json.
    iteration = tmp_path / "save" / "iter_0000003"
    dcp.save({"model": dict(model.state_dict())}, checkpoint_id=str(iteration / "model_and_optim"), no_dist=True)
    (iteration / "meta.json").write_text(json.dumps({"rollout_id": 2, "next_rollout_id": 3, "save_optim": False}))
    (tmp_path / "save" / "latest_checkpointed_iteration.txt").write_text("3")
    given_dir = {"root": tmp_path / "save", "iteration": iteration, "model_and_optim": iteration / "model_and_optim"}
    argv = ["mcore-to-hf", "--input-dir", str(given_dir[given]), "--output-dir", str(tmp_path / "h")]
    assert main([*argv, "--origin-hf-dir", str(hf_dir), "--no-progress"]) == 2
    named = iteration / "model_and_optim" if given == "model_and_optim" else iteration
    assert f"{named}: an FSDP checkpoint (--train-backend fsdp: iter_0000003/model_and_optim holds DCP" in caplog.text
    assert f"export it with `slime-convert fsdp-to-hf --input-dir {iteration} --output-dir DIR" in caplog.text
    assert f"(--load {tmp_path / 'save'})" in caplog.text and not (tmp_path / "h").exists()
    # The command it names exports it; the optimizer state beside the model is not read.
    argv = ["fsdp-to-hf", "--input-dir", str(iteration), "--output-dir", str(tmp_path / "h")]
    assert main([*argv, "--origin-hf-dir", str(hf_dir), "--no-progress"]) == 0
    exported = HFCheckpointReader(tmp_path / "h")
    assert sorted(exported.keys()) == sorted(HFCheckpointReader(hf_dir).keys())


def _fsdp_save(model, iteration, *, optim=True, meta=None):
    """slime_train_fsdp.checkpoint's layout: iter_<n>/model_and_optim (DCP of {"model", "optim"}), meta.json."""
    import torch.distributed.checkpoint as dcp

    state = {"model": dict(model.state_dict())}
    if optim:  # Adam's moments under the same names, as get_state_dict keys them
        state["optim"] = {"state": {n: {"exp_avg": torch.zeros_like(t)} for n, t in model.named_parameters()}}
    dcp.save(state, checkpoint_id=str(iteration / "model_and_optim"), no_dist=True)
    (iteration / "meta.json").write_text(json.dumps(meta or {"rollout_id": 2, "save_optim": optim}))
    (iteration.parent / "latest_checkpointed_iteration.txt").write_text(str(int(iteration.name.removeprefix("iter_"))))


def test_fsdp_to_hf_exports_the_model_bit_for_bit(tiny_hf_model, tmp_path):
    # The original's tools/convert_fsdp_to_hf.py had no counterpart: an FSDP run's checkpoint reached HF only through
    # the run's own --save-hf.
    import copy

    from slime_convert import fsdp_to_hf

    cached, hf_dir = tiny_hf_model("qwen3")
    model = copy.deepcopy(cached)  # the fixture's model is shared by the session's tests
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)  # trained: differs from the origin's weights
    _fsdp_save(model, tmp_path / "save" / "iter_0000003")
    out = fsdp_to_hf(tmp_path / "save", tmp_path / "h", hf_dir, dtype=None, progress=False)
    exported = HFCheckpointReader(out)
    origin = HFCheckpointReader(hf_dir)
    assert sorted(exported.keys()) == sorted(origin.keys())
    params = dict(model.state_dict())
    for name in exported.keys():
        assert torch.equal(exported.get(name), params[name]), name  # bit for bit, in the stored dtype
        assert not torch.equal(exported.get(name), origin.get(name)), name  # the trained weights, not the origin's
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == model.config.num_hidden_layers
    assert (out / "tokenizer_config.json").is_file() == (hf_dir / "tokenizer_config.json").is_file()


def test_fsdp_to_hf_refuses_another_model_and_a_lora_checkpoint(tiny_hf_model, tmp_path, caplog):
    model, hf_dir = tiny_hf_model("qwen3")
    _, llama_dir = tiny_hf_model("llama")
    _fsdp_save(model, tmp_path / "save" / "iter_0000001", optim=False)
    argv = ["fsdp-to-hf", "--input-dir", str(tmp_path / "save"), "--output-dir", str(tmp_path / "h"), "--no-progress"]
    assert main([*argv, "--origin-hf-dir", str(llama_dir)]) == 2
    assert f"{tmp_path / 'save' / 'iter_0000001' / 'model_and_optim'}: does not hold {llama_dir}'s model" in caplog.text
    assert not (tmp_path / "h").exists()
    # A LoRA checkpoint of a version that did not record --lora-alpha: its adapter's scale is unknown.
    flags = {"--lora-rank": 8, "--lora-target-modules": ["q_proj"]}  # slime_train_fsdp.checkpoint.model_flags_of
    _fsdp_save(model, tmp_path / "lora" / "iter_0000001", meta={"model_flags": flags})
    argv[2] = str(tmp_path / "lora")
    assert main([*argv, "--origin-hf-dir", str(hf_dir)]) == 2
    assert "a LoRA checkpoint whose meta.json does not record --lora-alpha" in caplog.text
    assert not (tmp_path / "h").exists()
    assert main([*argv[:2], str(hf_dir), *argv[3:], "--origin-hf-dir", str(hf_dir)]) == 2
    assert f"{hf_dir}: not an FSDP checkpoint (no model_and_optim/.metadata" in caplog.text


def test_tensors_and_shards_the_index_does_not_list_are_named(first_shard, tiny_hf_model, tmp_path, caplog):
    """The index decides what a checkpoint holds (as for transformers); what it leaves out was skipped unsaid."""
    from safetensors.torch import save_file

    _, hf_dir = tiny_hf_model("qwen3")
    model = shutil.copytree(hf_dir, tmp_path / "m")
    shard = first_shard(model)
    tensors = load_file(str(shard))
    save_file({**tensors, "model.extra.weight": torch.ones(3)}, str(shard), metadata={"format": "pt"})
    save_file({"model.stale.weight": torch.ones(2)}, str(model / "model-00009-of-00009.safetensors"))
    reader = HFCheckpointReader(model)
    assert "model.extra.weight" not in reader and "model.stale.weight" not in reader
    index = model / "model.safetensors.index.json"
    assert f"{index}: 1 tensors in {shard.name} are not in the index and are not read: ['model.extra.weight']" in (
        caplog.text
    )
    expected = (
        f"{index}: 1 safetensors files are not in the index and are not read: ['model-00009-of-00009.safetensors']"
    )
    assert expected in caplog.text


def test_without_an_index_a_tensor_in_two_files_is_refused(tmp_path, caplog):
    """With no index every *.safetensors was read and the later file silently won a name both hold."""
    from safetensors.torch import save_file

    model = tmp_path / "model"
    model.mkdir()
    save_file({"model.norm.weight": torch.ones(4)}, str(model / "model.safetensors"))
    save_file({"model.norm.weight": torch.zeros(4)}, str(model / "old-model.safetensors"))
    with pytest.raises(ValueError) as e:
        HFCheckpointReader(model)
    assert str(e.value) == (
        f"{model}: tensor 'model.norm.weight' is in both model.safetensors and old-model.safetensors, and there is "
        "no model.safetensors.index.json to say which one the checkpoint holds"
    )


def _lora_save(model, iteration, flags, *, rank=4, targets=("q_proj", "v_proj")):
    """A LoRA run's checkpoint as the FSDP trainer writes it: peft's `inject_adapter_in_model` (adapter `default`)
    on the HF model, the adapters alone in `model_and_optim` (B drawn non-zero: a trained adapter); returns the
    adapted model."""
    import copy

    import torch.distributed.checkpoint as dcp
    from peft import LoraConfig, inject_adapter_in_model

    config = LoraConfig(r=rank, lora_alpha=8.0, target_modules=list(targets))
    lora = inject_adapter_in_model(config, copy.deepcopy(model))
    torch.manual_seed(0)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if ".lora_B." in name:
                param.normal_(0, 0.5)
    adapters = {k: v for k, v in lora.state_dict().items() if ".lora_A." in k or ".lora_B." in k}
    dcp.save({"model": adapters}, checkpoint_id=str(iteration / "model_and_optim"), no_dist=True)
    (iteration / "meta.json").write_text(json.dumps({"next_rollout_id": 1, "model_flags": flags}))
    (iteration.parent / "latest_checkpointed_iteration.txt").write_text("1")
    return lora.eval()


def test_fsdp_to_hf_exports_a_lora_checkpoint_as_the_peft_adapter_peft_loads(tiny_hf_model, tmp_path):
    # A LoRA run's checkpoint was refused ("its adapter is exported by the run's --save-hf"): a run that died before
    # its --save-hf had no way to its adapter but resuming it.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model, hf_dir = tiny_hf_model("qwen3")
    flags = {"--lora-rank": 4, "--lora-alpha": 8.0, "--lora-target-modules": ["q_proj", "v_proj"]}
    trained = _lora_save(model, tmp_path / "save" / "iter_0000001", flags)
    argv = ["fsdp-to-hf", "--input-dir", str(tmp_path / "save"), "--origin-hf-dir", str(hf_dir), "--no-progress"]
    assert main([*argv, "--output-dir", str(tmp_path / "peft")]) == 0
    config = json.loads((tmp_path / "peft" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["target_modules"]) == (4, 8.0, ["q_proj", "v_proj"])
    base = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    served = PeftModel.from_pretrained(base, str(tmp_path / "peft")).eval()
    ids = torch.tensor([[1, 5, 9, 2, 7, 3]])
    with torch.no_grad():
        expected, got, plain = trained(ids).logits, served(ids).logits, model(ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)  # fp32: the same adapter at the same scale
    assert (expected - plain).abs().max() > 1e-2  # and the adapter does change the model


def test_fsdp_to_hf_refuses_an_adapter_that_does_not_fit_its_flags_or_origin(tiny_hf_model, tmp_path, caplog):
    model, hf_dir = tiny_hf_model("qwen3")
    flags = {"--lora-rank": 8, "--lora-alpha": 8.0, "--lora-target-modules": ["q_proj", "v_proj"]}
    _lora_save(model, tmp_path / "save" / "iter_0000001", flags)  # rank 4 saved, 8 recorded
    argv = ["fsdp-to-hf", "--input-dir", str(tmp_path / "save"), "--output-dir", str(tmp_path / "p"), "--no-progress"]
    assert main([*argv, "--origin-hf-dir", str(hf_dir)]) == 2
    assert (f"{tmp_path / 'save' / 'iter_0000001'}: not an adapter of --lora-rank 8 on {hf_dir}: "
            "model.layers.0.self_attn.q_proj: A [4, ") in caplog.text  # fmt: skip
    assert not (tmp_path / "p").exists()
    flags.update({"--lora-rank": 4, "--lora-target-modules": ["q_proj"]})  # v_proj adapted, not recorded
    _lora_save(model, tmp_path / "other" / "iter_0000001", flags)
    argv[2] = str(tmp_path / "other")
    assert main([*argv, "--origin-hf-dir", str(hf_dir)]) == 2
    assert "model.layers.0.self_attn.v_proj: not one of --lora-target-modules ['q_proj']" in caplog.text
    assert not (tmp_path / "p").exists()


def test_a_folder_of_bin_files_only_names_them_and_the_fix(tiny_hf_model, tmp_path, caplog):
    _, hf_dir = tiny_hf_model("qwen3")
    pickled = tmp_path / "bin"
    pickled.mkdir()
    shutil.copy(hf_dir / "config.json", pickled)
    state = {}
    for shard in sorted(hf_dir.glob("*.safetensors")):
        state.update(load_file(shard))
    torch.save(state, pickled / "pytorch_model.bin")
    argv = ["hf-to-mcore", "--hf-checkpoint", str(pickled), "--save", str(tmp_path / "m"), "--no-progress"]
    assert main(argv) == 2
    # Was only "no model.safetensors.index.json or *.safetensors in <dir>", as if the folder were the wrong one.
    assert "['pytorch_model.bin'] (PyTorch pickles): re-save them as safetensors" in caplog.text
    assert not (tmp_path / "m").exists()


def test_a_quantized_checkpoint_is_named_as_one(tiny_hf_model, tmp_path, caplog):
    from slime_convert.fp8 import hf_to_fp8

    _, hf_dir = tiny_hf_model("qwen3")
    hf_to_fp8(hf_dir, tmp_path / "fp8", block_size=(32, 32), progress=False)
    argv = ["hf-to-mcore", "--hf-checkpoint", str(tmp_path / "fp8"), "--save", str(tmp_path / "m"), "--no-progress"]
    assert main(argv) == 2
    # Was "... tensors that config.json does not describe would be dropped: ...weight_scale_inv ... A layer count or
    # another field is wrong in config.json", pointing at the wrong cause.
    assert f"{tmp_path / 'fp8' / 'config.json'}: a quantized checkpoint (quantization_config.quant_method='fp8')" in (
        caplog.text
    )
    assert "weight_scale_inv" not in caplog.text and not (tmp_path / "m").exists()
