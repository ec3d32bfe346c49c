"""The reference engine speaks SGLang's wire, as recorded from SGLang 0.5.16 on an H200.

`tests/fixtures/sglang-wire/{text,lora,vl}.json` hold real SGLang replies to the requests of `_sglang_wire.py`.
CPU: the same requests go to the reference engine, and every reply must have SGLang's structure (keys, value
types, `None` positions, list lengths) and status code. GPU (`-m sglang`): the requests go to real SGLang servers
again and the replies are diffed with the fixtures, so an SGLang upgrade that changes the wire fails here;
`SLIME_WIRE_RECORD_DIR=<dir>` also writes the new recording there (to refresh the fixtures).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import json
import os
import pathlib

import aiohttp
import pytest
import torch

from slime_core.config import SlimeArgs

_spec = importlib.util.spec_from_file_location("slime_sglang_wire", pathlib.Path(__file__).with_name("_sglang_wire.py"))
wire = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(wire)

# Compared for status and top-level type only, with the reason.
LOOSE = {
    # SGLang returns its ~300 ServerArgs; the reference engine has a handful of flags. slime reads none of them
    # but `weight_version` (and falls back to /model_info for that).
    "server_info",
}
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def write_lora_adapter(model_dir: pathlib.Path, out: pathlib.Path, rank: int = 8) -> pathlib.Path:
    """A PEFT adapter for every linear layer of a Qwen3 checkpoint (random A and B, seed 0), via slime's writer."""
    from slime_core.lora import PEFT_PREFIX
    from slime_rollout.weight_sync.lora import write_adapter

    config = json.loads((model_dir / "config.json").read_text())
    hidden, inter, head_dim = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * head_dim, config["num_key_value_heads"] * head_dim
    shapes = {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
              "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}  # fmt: skip
    g = torch.Generator().manual_seed(0)
    tensors = []
    for layer in range(config["num_hidden_layers"]):
        for module, (fan_in, fan_out) in shapes.items():
            part = "self_attn" if module.endswith(("q_proj", "k_proj", "v_proj", "o_proj")) else "mlp"
            name = f"{PEFT_PREFIX}model.layers.{layer}.{part}.{module}"
            tensors.append((f"{name}.lora_A.weight", 0.02 * torch.randn(rank, fan_in, generator=g)))
            tensors.append((f"{name}.lora_B.weight", 0.02 * torch.randn(fan_out, rank, generator=g)))
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1, "hf_checkpoint": str(model_dir),
                               "train_backend": "fsdp", "lora_rank": rank, "lora_alpha": 2.0 * rank,
                               "lora_target_modules": LORA_TARGETS,
                               "update_weight_disk_dir": str(out.parent)})  # fmt: skip
    write_adapter(cfg, [tensors], out)
    return out


def norm_tensor(model_dir: pathlib.Path, device: str) -> tuple[str, torch.Tensor]:
    """`model.norm.weight` as stored (a push that leaves the weights unchanged)."""
    from safetensors.torch import load_file

    if device == "cpu":
        torch.multiprocessing.set_sharing_strategy("file_system")  # as TensorWeightUpdater: any process can open it
    name = "model.norm.weight"
    return name, load_file(str(model_dir / "model.safetensors"))[name].to(device)


VL_PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many circles are there?<|im_end|>\n" \
            "<|im_start|>assistant\n"  # fmt: skip


def vl_request(model_dir: pathlib.Path) -> dict:
    """A multimodal `/generate` body as the rollout builds it (one pad per image, `image_data` as PNG data URIs)."""
    import base64
    import io

    from PIL import Image, ImageDraw

    from slime_rollout.data.multimodal import prepare_vision_prompt

    image = Image.new("RGB", (64, 64), (255, 255, 255))
    ImageDraw.Draw(image).ellipse([8, 8, 40, 40], fill=(220, 40, 40))
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    uri = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    vision = prepare_vision_prompt(str(model_dir), VL_PROMPT, [uri])
    return {"input_ids": list(vision.engine_input_ids), "image_data": list(vision.engine_images),
            "sampling_params": wire.GREEDY, "return_logprob": True}  # fmt: skip


async def record_server(server: str, url: str, model_dir: pathlib.Path, **extras) -> dict:
    async with aiohttp.ClientSession() as session:
        return await wire.record(server, wire.Ctx(url, str(model_dir), session, **extras))


def assert_same_wire(server: str, got: dict, recorded: dict) -> None:
    """Every recorded case: same status, and the same reply structure (or type only, `LOOSE`)."""
    problems = []
    for case, want in sorted(recorded.items()):
        if "error" in want:
            continue  # the recorder could not run this case against SGLang
        have = got.get(case)
        if have is None or "error" in have:
            problems.append(f"{server}/{case}: not answered ({have})")
            continue
        if have["status"] != want["status"]:
            problems.append(f"{server}/{case}: status {have['status']}, SGLang {want['status']} ({have['reply']})")
            continue
        if case in LOOSE:
            if type(have["reply"]) is not type(want["reply"]):
                problems.append(f"{server}/{case}: reply type {type(have['reply']).__name__}")
            continue
        for line in wire.diff_shapes(wire.shape(want["reply"]), wire.shape(have["reply"])):
            problems.append(f"{server}/{case}{line}")
    assert not problems, "the reference engine's replies differ from SGLang's:\n" + "\n".join(problems)


# ----------------------------------------------------------------------------------------------- CPU


@pytest.fixture(scope="module")
def wire_engine(tiny_qwen3_dir, private_tmp, reference_args, engine_base_port):
    """A reference engine of its own (the cases change weights, versions and adapters)."""
    from slime_rollout.engines.launch import launch_engines

    group = launch_engines(
        reference_args(tiny_qwen3_dir, sglang_args={"num_threads": "1", "dtype": "bfloat16"}),
        num_engines=1, gpus_per_engine=1, startup_timeout_s=300, log_dir=private_tmp / "wire-logs",
        base_port=engine_base_port + 60,
    )  # fmt: skip
    yield group
    group.shutdown()


def test_fixtures_hold_real_sglang_replies():
    text = wire.load("text")
    if not text:
        pytest.skip("no recording yet (run the GPU test with SLIME_WIRE_RECORD_DIR)")
    # What slime relies on, read off the recording itself.
    assert text["generate_logprob_start_3"]["reply"]["meta_info"]["input_token_logprobs"][0][0] is None
    assert all(e["status"] == 400 for k, e in text.items() if k.startswith("get_weights_by_name."))
    checker = text["weights_checker"]["reply"]
    assert checker["success"] and "model.layers.0.self_attn.qkv_proj.weight" in checker["ranks"][0]["checksums"]


@pytest.mark.slow  # an engine process of its own: the full CI pass runs it, not the isolation pass
def test_every_case_runs_against_the_reference_engine(wire_engine, tiny_qwen3_dir, private_tmp):
    """The recorder itself: every case gets an answer (no exception), and the sequences do what they say."""
    adapter = write_lora_adapter(tiny_qwen3_dir, private_tmp / "wire-lora-run" / "adapter")
    url = wire_engine.urls[0]
    text = asyncio.run(record_server("text", url, tiny_qwen3_dir, tensor=norm_tensor(tiny_qwen3_dir, "cpu")))
    lora = asyncio.run(record_server("lora", url, tiny_qwen3_dir, lora_dir=adapter))
    if os.environ.get("SLIME_WIRE_RECORD_DIR"):  # to look at the reference engine's side
        for server, exchanges in (("text", text), ("lora", lora)):
            path = pathlib.Path(os.environ["SLIME_WIRE_RECORD_DIR"]) / f"reference-{server}.json"
            path.write_text(json.dumps(exchanges, indent=1, sort_keys=True))
    assert [k for k, e in {**text, **lora}.items() if "error" in e] == []
    assert text["generate_aborted"]["reply"]["meta_info"]["finish_reason"]["type"] == "abort"
    assert text["abort_request"]["status"] == 200
    assert [lora[k]["status"] for k in ("load_lora_adapter", "generate_lora", "unload_lora_adapter")] == [200] * 3
    # SGLang 0.5.16's RequestValidationError handler: 400 (not FastAPI's default 422), its error object.
    for malformed in (text["update_weight_version_malformed"], lora["load_lora_adapter_malformed"]):
        assert malformed["status"] == 400 and malformed["reply"]["code"] == 400, malformed


@pytest.mark.slow  # an engine process of its own: the full CI pass runs it, not the isolation pass
def test_reference_engine_speaks_sglangs_text_wire(wire_engine, tiny_qwen3_dir, private_tmp):
    recorded = wire.load("text")
    if not recorded:
        pytest.skip("no recording yet")
    got = asyncio.run(
        record_server("text", wire_engine.urls[0], tiny_qwen3_dir, tensor=norm_tensor(tiny_qwen3_dir, "cpu"))
    )
    assert_same_wire("text", got, recorded)


@pytest.mark.slow  # an engine process of its own: the full CI pass runs it, not the isolation pass
def test_reference_engine_speaks_sglangs_lora_wire(wire_engine, tiny_qwen3_dir, private_tmp):
    recorded = wire.load("lora")
    if not recorded:
        pytest.skip("no recording yet")
    adapter = write_lora_adapter(tiny_qwen3_dir, private_tmp / "wire-lora" / "adapter")
    got = asyncio.run(record_server("lora", wire_engine.urls[0], tiny_qwen3_dir, lora_dir=adapter))
    assert_same_wire("lora", got, recorded)


@pytest.mark.slow  # several engine processes (10-30 s): the full CI pass runs it
def test_reference_engine_speaks_sglangs_vl_wire(make_tiny_vlm, private_tmp, reference_args, engine_base_port):
    recorded = wire.load("vl")
    if not recorded:
        pytest.skip("no recording yet")
    from slime_rollout.engines.launch import launch_engines

    model_dir = make_tiny_vlm(private_tmp / "wire-vlm", "qwen3_vl")
    group = launch_engines(reference_args(model_dir), num_engines=1, gpus_per_engine=1, startup_timeout_s=300,
                           log_dir=private_tmp / "wire-vl-logs", base_port=engine_base_port + 70)  # fmt: skip
    try:
        got = asyncio.run(record_server("vl", group.urls[0], model_dir, vl_request=vl_request(model_dir)))
    finally:
        group.shutdown()
    assert_same_wire("vl", got, recorded)


# ----------------------------------------------------------------------------------------------- GPU


@pytest.mark.sglang
@pytest.mark.gpu
def test_record_and_diff_real_sglang(tmp_path_factory, make_tiny_qwen3):
    """Starts the `text` and `lora` servers side by side, runs every case, diffs with the fixtures, records."""
    if importlib.util.find_spec("sglang") is None and not os.environ.get("SLIME_SGLANG_PYTHONPATH"):
        pytest.skip("needs SGLang (installed, or staged with SLIME_SGLANG_PYTHONPATH)")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from slime_rollout.engines.launch import launch_engines

    model_dir = make_tiny_qwen3(
        tmp_path_factory.mktemp("wire-qwen3"), dtype=torch.bfloat16, hidden_size=256, intermediate_size=512,
        num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
        torch_dtype="bfloat16",
    )  # fmt: skip
    adapter = write_lora_adapter(model_dir, tmp_path_factory.mktemp("wire-lora") / "adapter")
    import slime_make_model

    vl_dir = tmp_path_factory.mktemp("wire-vl") / "qwen3-vl-tiny"
    slime_make_model.make_model("qwen3-vl-tiny", vl_dir)
    log_dir = os.environ.get("SLIME_TEST_LOG_DIR") or tmp_path_factory.mktemp("wire-logs")
    base = {"rollout_batch_size": 1, "num_rollout": 1, "rollout_engine": "sglang", "hf_checkpoint": str(model_dir),
            "seed": 1, "sglang_args": {"disable_cuda_graph": True, "max_total_tokens": "8192"},
            "rollout_num_gpus_per_engine": 1}  # fmt: skip
    lora = {**base, "train_backend": "fsdp", "lora_rank": 8, "lora_alpha": 16.0, "lora_target_modules": LORA_TARGETS,
            "update_weight_disk_dir": str(adapter.parent)}  # fmt: skip
    launches = {
        # colocate=True: the memory saver is on, as when a trainer shares the GPU (release/resume are cases).
        "text": lambda: launch_engines(SlimeArgs.from_dict(base), num_engines=1, gpus_per_engine=1, colocate=True,
                                       mem_fraction_static=0.9, startup_timeout_s=600, log_dir=log_dir,
                                       base_port=31000),
        "lora": lambda: launch_engines(SlimeArgs.from_dict(lora), num_engines=1, gpus_per_engine=1, colocate=False,
                                       mem_fraction_static=0.9, startup_timeout_s=600, log_dir=log_dir,
                                       base_port=32000),
        # FA3 (SGLang's vision attention default on Hopper) is not staged: the Triton kernel.
        "vl": lambda: launch_engines(SlimeArgs.from_dict({**base, "hf_checkpoint": str(vl_dir), "sglang_args": {
                                         **base["sglang_args"], "mm_attention_backend": "triton_attn"}}),
                                     num_engines=1, gpus_per_engine=1, colocate=False, mem_fraction_static=0.9,
                                     startup_timeout_s=600, log_dir=log_dir, base_port=33000),
    }  # fmt: skip
    with contextlib.ExitStack() as stack, concurrent.futures.ThreadPoolExecutor(len(launches)) as pool:
        groups = {name: pool.submit(start) for name, start in launches.items()}
        groups = {name: stack.enter_context(future.result()) for name, future in groups.items()}
        recordings = {
            "text": asyncio.run(record_server("text", groups["text"].urls[0], model_dir,
                                              tensor=norm_tensor(model_dir, "cuda"))),
            "lora": asyncio.run(record_server("lora", groups["lora"].urls[0], model_dir, lora_dir=adapter)),
            "vl": asyncio.run(record_server("vl", groups["vl"].urls[0], vl_dir, vl_request=vl_request(vl_dir))),
        }  # fmt: skip
    out = os.environ.get("SLIME_WIRE_RECORD_DIR")
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        for server, exchanges in recordings.items():
            (pathlib.Path(out) / f"{server}.json").write_text(json.dumps(exchanges, indent=1, sort_keys=True) + "\n")
    errors = {f"{s}/{c}": e["error"] for s, r in recordings.items() for c, e in r.items() if "error" in e}
    assert not errors, errors
    # Our checksum of the checkpoint's bytes equals SGLang's for every parameter it holds (fused ones included).
    from slime_rollout.weight_sync.check import PushChecksums

    engine = recordings["text"]["weights_checker"]["reply"]["ranks"][0]["checksums"]
    ours = PushChecksums.from_checkpoint(model_dir, len(engine), seed=0, dtype=torch.bfloat16, engine_names=engine)
    print(f"weights_checker: {len(engine)} engine tensors, {len(ours.checksums)} from the checkpoint; engine only: "
          f"{sorted(set(engine) - set(ours.checksums))}")  # fmt: skip
    assert ours.unmatched == 0 and len(ours.checksums) == 2 * 8 + 2  # 2 layers x 8 engine tensors, embed, norm
    assert {name: engine[name] for name in ours.checksums} == ours.checksums
    for server, exchanges in recordings.items():
        recorded = wire.load(server)
        if recorded:  # SGLang against its own earlier recording: the same structure
            assert_same_wire(server, exchanges, recorded)
