"""The qwen3-vl-tiny preset of `apps/make_model`, and what SGLang 0.5.16 builds from the rollout's image requests.

SGLang is not installed here: its side is written out from its source (`python/sglang/srt/...` of 0.5.16) in
`smart_resize`, `sglang_prompt` and `sglang_mrope` below, and the rollout (`slime_rollout.data.multimodal`), the
trainer (`slime_train_fsdp.vision`) and the CPU reference engine are held to it:

- the images the rollout sends are already at the size the processor resizes them to (16-pixel patches, 2x2 merge,
  65536 to 16777216 pixels, multiples of 32), so SGLang's processor expands each into
  `(h / 16) * (w / 16) / 4` tokens, the number the trainer's prompt holds;
- the request holds one `<|image_pad|>` per image; SGLang decodes it, finds each image as
  `<|vision_start|><|image_pad|>+<|vision_end|>` in the text, and expands the i-th pad of the sent ids into image
  i's tokens: exactly the trainer's prompt ids;
- SGLang's 3-D rotary positions (built from the image offsets for Qwen3-VL) equal the trainer's
  (`get_rope_index`) on the prompt and on the decoded tokens after it.

The slow test loads the preset's weights in the reference engine and the FSDP trainer (CPU, fp32) and checks the
first-step log-prob parity on a prompt with an image.
"""

import base64
import importlib.util
import io
import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoProcessor, Qwen3VLConfig, Qwen3VLForConditionalGeneration

import slime_make_model as mm
from slime_make_model.presets import PRESETS
from slime_make_model.vl_files import VL_CHAT_TEMPLATE, write_vl_files
from slime_rollout.data import multimodal
from slime_rollout.engines.reference.vision import mrope_positions
from slime_train_fsdp.vision import mrope_position_ids

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3-tokenizer"
VISION_START, IMAGE_PAD, VISION_END = 151652, 151655, 151653
PATCH, MERGE, MIN_PIXELS, MAX_PIXELS = 16, 2, 65536, 16777216
_spec = importlib.util.spec_from_file_location(
    "slime_test_qwen_vl_rules", Path(__file__).resolve().parents[1] / "_qwen_vl_rules.py"
)
_vl_rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_vl_rules)
PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many circles are there?<|im_end|>\n"


# ---- SGLang 0.5.16, written from its source -----------------------------------------------------------------


def smart_resize(height: int, width: int) -> tuple[int, int]:
    """SGLang's Qwen-VL size rule (`tests/_qwen_vl_rules.py`) with the preset's patch, merge and pixel bounds."""
    return _vl_rules.smart_resize(height, width, PATCH * MERGE, MIN_PIXELS, MAX_PIXELS)


def sglang_prompt(tokenizer, input_ids: list[int], images: list) -> list[int]:
    """The prompt SGLang builds from `/generate` `input_ids` + `image_data` (`tokenizer_manager.py`
    `_tokenize_one_request` -> `base_processor.py` `load_mm_data` / `process_and_combine_mm_data` with
    `SGLANG_MM_AVOID_RETOKENIZE` on, its default): the ids are decoded, the images found in the text by
    `QwenVLImageProcessor`'s regex, and the i-th `<|image_pad|>` of the ids expanded to image i's token count
    (`_expand_input_ids`)."""
    text = tokenizer.decode(input_ids)
    found = re.findall(r"<\|vision_start\|>(?:<\|image_pad\|>)+<\|vision_end\|>", text)
    assert len(found) == len(images), "SGLang would take its legacy path (placeholders and images disagree)"
    assert input_ids.count(IMAGE_PAD) == len(images), "SGLang's processor would fail on this text"
    counts = iter((h // PATCH) * (w // PATCH) // MERGE**2 for h, w in (smart_resize(i.height, i.width) for i in images))
    return [t for token in input_ids for t in ([token] * next(counts) if token == IMAGE_PAD else [token])]


def sglang_mrope(input_ids: list[int], grids: list[tuple[int, int, int]], decoded: int) -> torch.Tensor:
    """`[3, P + decoded]` rotary positions SGLang gives a Qwen3-VL prompt and the tokens decoded after it
    (`qwen_vl.py` `_compute_image_only_mrope_positions_from_offsets`, then `mrope_position_delta` when decoding):
    text advances all three rows by one; image i (its run of image tokens, patch grid `grids[i]`) gets
    (t, row, column) in merged patches added to the position where it starts, and the text after it continues at
    that position plus `max(t, h / merge, w / merge)`; decoded tokens continue at the prompt's maximum + 1."""
    rows, next_pos, i, image = [], 0, 0, 0
    while i < len(input_ids):
        if input_ids[i] != IMAGE_PAD:
            rows.append([next_pos] * 3)
            next_pos, i = next_pos + 1, i + 1
            continue
        t, h, w = grids[image][0], grids[image][1] // MERGE, grids[image][2] // MERGE
        rows += [[next_pos + a, next_pos + b, next_pos + c] for a in range(t) for b in range(h) for c in range(w)]
        next_pos, i, image = next_pos + max(t, h, w), i + t * h * w, image + 1
    start = max(max(r) for r in rows) + 1
    rows += [[start + k] * 3 for k in range(decoded)]
    return torch.tensor(rows).T


# ---- the preset ---------------------------------------------------------------------------------------------


def reference_param_count(h, layers, heads, kv, inter, tie, vocab=151936, hd=128):
    """Independent count of a Qwen3 language model: q/k/v/o, q/k RMSNorm, SwiGLU MLP, 2 layer norms, final norm."""
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h + 2 * hd
    per_layer = attn + 3 * h * inter + 2 * h
    return layers * per_layer + vocab * h * (1 if tie else 2) + h


def vision_param_count(hidden=256, inter=1024, depth=2, out=1024, deepstack=1, grid=2304, patch=PATCH) -> int:
    """Independent count of a Qwen3-VL vision tower: conv patch embedding, learned positions, blocks (LayerNorms,
    qkv, proj, 2-layer MLP, all with biases), the 2x2 patch merger and one more merger per deepstack layer."""
    merged = hidden * MERGE**2
    block = 2 * 2 * hidden + (hidden * 3 * hidden + 3 * hidden) + (hidden * hidden + hidden)
    block += (hidden * inter + inter) + (inter * hidden + hidden)
    merger = (merged * merged + merged) + (merged * out + out)
    return (
        (3 * 2 * patch * patch * hidden + hidden)
        + grid * hidden
        + depth * block
        + (2 * hidden + merger)
        + deepstack * (2 * merged + merger)
    )


def test_preset_config_and_parameter_count():
    cfg = mm.preset_config("qwen3-vl-tiny")
    assert isinstance(cfg, Qwen3VLConfig) and cfg.tie_word_embeddings
    text, vision = cfg.text_config, cfg.vision_config
    assert (text.hidden_size, text.num_hidden_layers, text.num_attention_heads, text.num_key_value_heads) == (
        1024, 2, 16, 8,
    )  # fmt: skip
    assert text.head_dim == 128 and text.vocab_size == 151936 and text.intermediate_size == 3072
    assert text.rope_parameters["mrope_section"] == [24, 20, 20] and text.rope_parameters["rope_theta"] == 5e6
    assert (vision.depth, vision.hidden_size, vision.num_heads, vision.out_hidden_size) == (2, 256, 4, 1024)
    assert vision.deepstack_visual_indexes == [0] and vision.num_position_embeddings == 48 * 48
    assert (cfg.image_token_id, cfg.vision_start_token_id, cfg.vision_end_token_id) == (IMAGE_PAD, VISION_START,
                                                                                        VISION_END)  # fmt: skip
    lm = reference_param_count(1024, 2, 16, 8, 3072, True)
    assert mm.count_parameters(cfg) == lm + vision_param_count() == 193_809_152
    shapes = mm.parameter_shapes(cfg)
    assert "lm_head.weight" not in shapes  # tied: the embedding
    assert shapes["model.visual.blocks.0.attn.qkv.weight"] == (768, 256)
    assert shapes["model.visual.deepstack_merger_list.0.linear_fc2.weight"] == (1024, 1024)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The preset's directory without weights (config, processor, tokenizer, chat template)."""
    out = tmp_path_factory.mktemp("vl-files")
    write_vl_files(out, PRESETS["qwen3-vl-tiny"], FIXTURE, "bfloat16")
    return out


def test_files_load_offline_with_the_qwen_vl_template(files):
    names = {p.name for p in files.iterdir()}
    assert names == {"config.json", "preprocessor_config.json", "video_preprocessor_config.json", "chat_template.jinja",
                     "tokenizer.json", "tokenizer_config.json"}  # fmt: skip
    assert json.loads((files / "config.json").read_text())["text_config"]["rope_scaling"] == {
        "rope_type": "default", "mrope_section": [24, 20, 20], "mrope_interleaved": True,
    }  # fmt: skip
    assert AutoConfig.from_pretrained(files).model_type == "qwen3_vl"
    processor = AutoProcessor.from_pretrained(files)  # HF_HUB_OFFLINE=1 (tests/conftest.py)
    assert type(processor).__name__ == "Qwen3VLProcessor"
    image = processor.image_processor
    assert (image.patch_size, image.merge_size, image.temporal_patch_size) == (PATCH, MERGE, 2)
    assert (image.size["shortest_edge"], image.size["longest_edge"]) == (MIN_PIXELS, MAX_PIXELS)
    assert list(image.image_mean) == list(image.image_std) == [0.5, 0.5, 0.5]
    messages = multimodal.build_messages("<image>How many circles are there?", ["x.png"], where="w")
    text = processor.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == PROMPT + "<|im_start|>assistant\n"
    assert processor.tokenizer.chat_template == VL_CHAT_TEMPLATE == processor.chat_template
    assert processor.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text


def _png(size: tuple[int, int], color=(200, 40, 40)) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.mark.parametrize(
    ("sizes", "grids"),
    [
        # geo3k's 64x64 pictures are scaled up to the 65536-pixel minimum: 256x256, a 16x16 grid, 64 tokens.
        ([(64, 64)], [(1, 16, 16)]),
        # 300x170 rounds to 288x160 (46080 pixels), then scales up by sqrt(65536 / 51000): 352x224.
        ([(300, 170)], [(1, 14, 22)]),
        # Within the bounds: sides rounded to multiples of 32 (1000x700 -> 992x704); two images in one prompt.
        ([(1000, 700), (64, 64)], [(1, 44, 62), (1, 16, 16)]),
    ],
)
def test_sglang_builds_the_trainer_prompt_from_the_rollout_request(files, sizes, grids):
    text = "<|im_start|>user\n" + "<|vision_start|><|image_pad|><|vision_end|>" * len(sizes) + "n?<|im_end|>\n"
    images = [_png(s) for s in sizes]
    vp = multimodal.prepare_vision_prompt(str(files), text, images)
    want = [(1, h // PATCH, w // PATCH) for h, w in (smart_resize(hh, ww) for ww, hh in sizes)]
    assert want == grids == [tuple(g) for g in vp.train_inputs["image_grid_thw"].tolist()]
    sent = [multimodal.decode_image(i) for i in vp.engine_images]
    assert [im.size for im in sent] == [(w * PATCH, h * PATCH) for _, h, w in grids]  # resized before sending
    tokenizer = multimodal.get_processor(str(files)).tokenizer
    # The request: one pad per image, as the template wrote it; SGLang rebuilds the trainer's prompt from it.
    assert list(vp.engine_input_ids) == tokenizer.encode(text, add_special_tokens=False)
    assert sglang_prompt(tokenizer, list(vp.engine_input_ids), sent) == list(vp.input_ids)
    assert list(vp.input_ids).count(IMAGE_PAD) == sum(t * h * w // MERGE**2 for t, h, w in grids)
    # Ids already expanded (what the original slime sends) would give SGLang's processor one image per pad.
    with pytest.raises(AssertionError, match="processor would fail"):
        sglang_prompt(tokenizer, list(vp.input_ids), sent)
    # 3-D rotary positions: SGLang's from the image offsets = the trainer's and the reference engine's.
    config = AutoConfig.from_pretrained(files)
    with torch.device("meta"):
        inner = Qwen3VLForConditionalGeneration(config).model  # get_rope_index needs the config only
    grid = vp.train_inputs["image_grid_thw"]
    response = [17, IMAGE_PAD, 19]  # a sampled image token in a response is text to both
    trainer = mrope_position_ids(inner, torch.tensor([*vp.input_ids, *response]), grid, len(vp.input_ids))
    expected = sglang_mrope(list(vp.input_ids), grids, decoded=len(response))
    assert torch.equal(trainer, expected)
    assert torch.equal(mrope_positions(inner, vp.input_ids, grid), expected[:, : len(vp.input_ids)])


def test_geo3k_rows_become_prompts_of_64_image_tokens(files):
    """The e2e data (`benchmarks/bench_e2e.sh` VL=1): geo3k-style Parquet rows with PNG bytes, read with the
    example's flags (`--input-key problem --label-key answer --multimodal-keys '{"image": "images"}'
    --apply-chat-template`) and the preset's template."""
    from slime_rollout.data.source import load_prompt_rows, rows_to_samples

    data = Path(__file__).resolve().parents[2] / "examples" / "geo3k-vlm" / "data" / "train.parquet"
    rows = load_prompt_rows(str(data))[:3]
    samples = rows_to_samples(rows, source=str(data), input_key="problem", label_key="answer",
                              tokenizer=multimodal.get_processor(str(files)).tokenizer, apply_chat_template=True,
                              multimodal_keys={"image": "images"}, processor_path=str(files))  # fmt: skip
    assert [s.label for s in samples] == [r["answer"] for r in rows]
    for sample, row in zip(samples, rows, strict=True):
        question = row["problem"].removeprefix("<image>")
        assert sample.prompt == PROMPT.replace("How many circles are there?", question) + "<|im_start|>assistant\n"
        (image,) = sample.multimodal_inputs["images"]
        vp = multimodal.prepare_vision_prompt(str(files), sample.prompt, [image])
        assert vp.train_inputs["image_grid_thw"].tolist() == [[1, 16, 16]]  # 64x64 -> 256x256
        assert list(vp.input_ids).count(IMAGE_PAD) == 64 and list(vp.engine_input_ids).count(IMAGE_PAD) == 1


# ---- the weights in the reference engine and the trainer ----------------------------------------------------


@pytest.mark.slow
def test_preset_model_serves_and_trains_with_first_step_parity(tmp_path, monkeypatch):
    """make_model writes the preset (bf16); the reference engine (fp32) answers a geo3k-style prompt through the
    default generate, and the FSDP trainer (fp32, gloo, world 1) computes the same log-probs (tolerance 1e-5:
    fp32 on both sides, different batching and summation order; measured 1.9e-6)."""
    pytest.importorskip("fastapi", reason="the reference engine's HTTP app needs fastapi")
    import socket

    import torch.distributed as dist
    from fastapi.testclient import TestClient

    from slime_core.config import PluginArgs, SlimeArgs
    from slime_core.sample import Sample
    from slime_core.train_data import build_rollout_batches
    from slime_rollout.engines.reference.model import ReferenceModel
    from slime_rollout.engines.reference.server import build_app
    from slime_rollout.generation import generate as generate_mod
    from slime_rollout.runtime import async_utils
    from slime_train_fsdp import FSDPTrainBackend

    path = mm.make_model("qwen3-vl-tiny", tmp_path / "model", FIXTURE, "bfloat16", seed=0)
    fields = dict(hf_checkpoint=str(path), train_backend="fsdp", rollout_batch_size=1, n_samples_per_prompt=2,
                  global_batch_size=2, micro_batch_size=2, num_rollout=1, rollout_max_response_len=4,
                  rollout_temperature=1.0, seed=3, attn_implementation="sdpa")  # fmt: skip
    cfg = SlimeArgs.from_dict(fields)
    args = PluginArgs.from_config(cfg)
    engine = ReferenceModel(str(path))
    with TestClient(build_app(engine, max_running_requests=4, random_seed=0, server_args={})) as http:

        class Client:
            def generate(self, payload):
                reply = http.post("/generate", json=payload)
                assert reply.status_code == 200, reply.text
                return reply.json()

        client = Client()
        monkeypatch.setattr(generate_mod, "get_client", lambda _args: client)
        image = _png((64, 64), (30, 90, 200))
        prompt = PROMPT + "<|im_start|>assistant\n"
        samples = [Sample(prompt=prompt, multimodal_inputs={"images": [image]}, index=i) for i in range(2)]

        async def run():
            for s in samples:
                await generate_mod.generate(args, s, generate_mod.build_sampling_params(cfg))

        async_utils.run(run())
    # A 64x64 picture is 64 image tokens in the prompt (scaled up to 256x256); the engine agreed (prompt_tokens).
    assert all(s.response_length > 0 and s.tokens[: -s.response_length].count(IMAGE_PAD) == 64 for s in samples)
    for s in samples:
        s.reward = float(s.index)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for key, value in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, RANK=0, WORLD_SIZE=1, LOCAL_RANK=0).items():
        monkeypatch.setenv(key, str(value))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        backend = FSDPTrainBackend()
        backend.init(cfg, with_ref=False)
        batch = build_rollout_batches(cfg, samples, dp_size=1)[0]
        trainer = backend.compute_log_probs(batch)
    finally:
        dist.destroy_process_group()
    for got, want in zip(trainer, batch.rollout_log_probs, strict=True):
        torch.testing.assert_close(got.float(), torch.as_tensor(want).float(), atol=1e-5, rtol=0)
