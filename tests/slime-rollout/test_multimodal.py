"""Images through data and rollout: `slime_rollout.data.multimodal`, `rows_to_samples` with `--multimodal-keys`, and
the default generate's `/generate` request with `image_data`.

Models are tiny random Qwen2.5-VL / Qwen3-VL checkpoints with the real Qwen tokenizer (`make_tiny_vlm`): image
tokens are `<|vision_start|>` 151652, `<|image_pad|>` 151655, `<|vision_end|>` 151653; the processors resize
images to multiples of 28 (Qwen2.5-VL, patch 14) or 32 (Qwen3-VL, patch 16) pixels and merge 2x2 patches per
image token.
"""

import base64
import importlib.util
import io
import json
import pathlib

import pytest
import torch

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample, Status
from slime_rollout.data import multimodal
from slime_rollout.data.source import load_prompt_rows, rows_to_samples
from slime_rollout.generation import generate as generate_mod

_spec = importlib.util.spec_from_file_location(
    "slime_test_qwen_vl_rules", pathlib.Path(__file__).resolve().parents[1] / "_qwen_vl_rules.py"
)
_vl_rules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_vl_rules)

VISION_START, IMAGE_PAD, VISION_END = 151652, 151655, 151653
PATCH = {"qwen2_5_vl": 14, "qwen3_vl": 16}


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def vlm(request, make_tiny_vlm, private_tmp):
    family = request.param
    path = private_tmp / f"vlm-{family}"
    if not path.exists():
        make_tiny_vlm(path, family)
    return family, str(path)


def png_bytes(size=(40, 30), color=(200, 10, 10)) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return buf.getvalue()


# ---- normalize_image: every dataset form, and the errors ------------------------------------------------------


def test_every_image_form_becomes_a_path_or_data_uri(tmp_path, monkeypatch):
    raw = png_bytes()
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "a.png").write_bytes(raw)
    b64 = base64.b64encode(raw).decode()
    want_uri = "data:image/png;base64," + b64
    at = dict(base_dir=tmp_path, where="d.jsonl row 1")
    assert multimodal.normalize_image("imgs/a.png", **at) == str(tmp_path / "imgs" / "a.png")
    assert multimodal.normalize_image(f"file://{tmp_path}/imgs/a.png", **at) == str(tmp_path / "imgs" / "a.png")
    monkeypatch.chdir(tmp_path / "imgs")  # relative to the working directory when not under the data dir
    assert multimodal.normalize_image("a.png", base_dir=tmp_path / "elsewhere", where="w") == str(
        tmp_path / "imgs" / "a.png"
    )
    assert multimodal.normalize_image(raw, **at) == want_uri
    assert multimodal.normalize_image(b64, **at) == want_uri
    assert multimodal.normalize_image(want_uri, **at) == want_uri
    assert multimodal.normalize_image({"bytes": raw, "path": None}, **at) == want_uri  # HF datasets Image
    assert multimodal.normalize_image({"bytes": None, "path": "imgs/a.png"}, **at) == str(tmp_path / "imgs/a.png")
    cell = json.dumps(["imgs/a.png", b64])  # a list stored as a JSON string column
    assert multimodal.normalize_images(cell, **at) == [str(tmp_path / "imgs" / "a.png"), want_uri]
    assert multimodal.normalize_images(raw, **at) == [want_uri]  # a single image, not a list
    assert multimodal.normalize_images(None, **at) == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("missing/b.png", "d.jsonl row 3: image 'missing/b.png' is neither an existing file"),
        ("https://example.com/x.png", "d.jsonl row 3: image URLs are not fetched"),
        (b"not an image at all", "d.jsonl row 3: not a readable image"),
        (base64.b64encode(b"not an image").decode(), "d.jsonl row 3: not a readable image"),
        ("data:image/png;base64,@@@", "d.jsonl row 3: the data: URI does not hold valid base64"),
        ({"pixels": [1, 2]}, "d.jsonl row 3: image dict has unknown keys ['pixels']"),
        (3.5, "d.jsonl row 3: an image must be a path, bytes or base64 string, got float"),
    ],
)
def test_bad_images_name_the_row(tmp_path, value, message):
    with pytest.raises(ValueError) as err:
        multimodal.normalize_image(value, base_dir=tmp_path, where="d.jsonl row 3")
    assert message in str(err.value)


def test_a_malformed_json_list_cell_names_the_row(tmp_path):
    # json.loads' bare JSONDecodeError named neither file nor row.
    with pytest.raises(ValueError, match=r"d.jsonl line 4: the image cell '\[a.png, b.png\]' looks like a JSON list"):
        multimodal.normalize_images("[a.png, b.png]", base_dir=tmp_path, where="d.jsonl line 4")


def test_check_row_images_decodes_and_counts(tmp_path):
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    good = {"q": "<image> and <image>?", "images": [png_bytes(), png_bytes(color=(0, 0, 9))]}
    assert multimodal.check_row_images(good, input_key="q", image_key="images", base_dir=tmp_path, where="r1") == 2
    with pytest.raises(ValueError, match="r2: the prompt has 1 <image> placeholder"):
        multimodal.check_row_images(dict(good, q="<image>?"), input_key="q", image_key="images", base_dir=tmp_path,
                                    where="r2")  # fmt: skip
    with pytest.raises(ValueError, match="r3 image 1: .*cannot be decoded"):
        multimodal.check_row_images({"q": "<image>", "images": ["bad.png"]}, input_key="q", image_key="images",
                                    base_dir=tmp_path, where="r3")  # fmt: skip


def test_placeholders_split_text_into_image_and_text_parts():
    messages = multimodal.build_messages("Look: <image> then <image>.", ["i1", "i2"], where="w")
    assert messages == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look: "},
                {"type": "image", "image": "i1"},
                {"type": "text", "text": " then "},
                {"type": "image", "image": "i2"},
                {"type": "text", "text": "."},
            ],
        }
    ]
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "<image>x"}]
    out = multimodal.build_messages(chat, ["i1"], where="w")
    assert out[0]["content"] == [{"type": "text", "text": "Be brief."}]
    assert out[1]["content"] == [{"type": "image", "image": "i1"}, {"type": "text", "text": "x"}]
    assert chat[1]["content"] == "<image>x"  # the dataset's messages are not modified


def test_an_image_over_pillows_size_limit_is_one_error_naming_the_row(tmp_path, monkeypatch):
    # Pillow refuses images over 2 x MAX_IMAGE_PIXELS with DecompressionBombError, which is no ValueError: it left
    # preflight and the data source as a bare traceback naming neither file nor row. The limit is lowered here so
    # a 100x100 image stands for a 15000x12000 one (monkeypatch restores it).
    from PIL import Image

    big = png_bytes(size=(100, 100))
    (tmp_path / "big.png").write_bytes(big)
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    row = {"q": "<image>?", "images": ["big.png"]}
    with pytest.raises(ValueError, match=r"d.jsonl line 7 image 1: image .*big.png: too large to decode .*2000 pixels"):
        multimodal.check_row_images(row, input_key="q", image_key="images", base_dir=tmp_path, where="d.jsonl line 7")
    with pytest.raises(ValueError, match=r"d.parquet row index 2 image 1: too large to decode"):
        multimodal.normalize_images([big], base_dir=tmp_path, where="d.parquet row index 2")


def test_bare_image_parts_of_chat_messages_take_the_column_images():
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    out = multimodal.build_messages(chat, ["i1"], where="w")
    assert out[0]["content"] == [{"type": "image", "image": "i1"}, {"type": "text", "text": "How many?"}]
    with pytest.raises(ValueError, match="w: the prompt has 1 <image> placeholder.* for 2 image"):
        multimodal.build_messages(chat, ["i1", "i2"], where="w")


@pytest.mark.parametrize(
    ("part", "kind"),
    [
        ({"type": "image", "image": "a.png"}, "image"),
        ({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}, "image"),
        ({"type": "video", "video": "clip.mp4"}, "video"),
    ],
)
def test_media_inside_chat_messages_is_refused_not_dropped(vlm, tmp_path, part, kind):
    # Such a part was kept as it was: the template rendered <|vision_start|><|image_pad|><|vision_end|> into the
    # prompt while the sample had no images, so the engine and the trainer got an image token without pixels.
    _, path = vlm
    rows = [{"q": [{"role": "user", "content": [part, {"type": "text", "text": "How many?"}]}], "a": "1"}]
    data = _write_rows(tmp_path, rows, "jsonl")
    with pytest.raises(
        ValueError, match=rf"line 1: message 1 content part 1 carries its own {kind} .*--multimodal-keys"
    ):
        rows_to_samples(
            load_prompt_rows(str(data)), source=str(data), input_key="q", label_key="a",
            tokenizer=multimodal.get_processor(path).tokenizer, apply_chat_template=True,
            multimodal_keys={"image": "images"}, processor_path=path,
        )  # fmt: skip


def test_an_undecodable_image_met_by_the_prompt_length_filter_names_the_row(vlm, tmp_path):
    # --rollout-max-prompt-len processes each prompt with its images at load time; the error named only the image.
    _, path = vlm
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    data = _write_rows(tmp_path, [{"q": "<image>?", "a": "1", "images": ["bad.png"]}], "jsonl")
    with pytest.raises(ValueError, match=r"data.jsonl line 1: image .*bad.png: cannot be decoded"):
        rows_to_samples(
            load_prompt_rows(str(data)), source=str(data), input_key="q", label_key="a",
            tokenizer=multimodal.get_processor(path).tokenizer, apply_chat_template=True, max_prompt_len=4096,
            multimodal_keys={"image": "images"}, processor_path=path,
        )  # fmt: skip


# ---- processor and chat template: the token layout --------------------------------------------------------------


def test_template_and_processor_token_layout(vlm):
    family, path = vlm
    patch = PATCH[family]
    image = "data:image/png;base64," + base64.b64encode(png_bytes(size=(90, 50))).decode()
    processor = multimodal.get_processor(path)
    text = processor.apply_chat_template(multimodal.build_messages("<image>How many?", [image], where="w"),
                                         tokenize=False, add_generation_prompt=True)  # fmt: skip
    assert text == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>\n<|im_start|>assistant\n"
    )
    vp = multimodal.prepare_vision_prompt(path, text, [image])
    grid = vp.train_inputs["image_grid_thw"]
    # 90x50 -> the nearest multiples of 2*patch: 84x56 (patch 14) or 96x64 (patch 16), a 4x6 patch grid either way.
    assert grid.tolist() == [[1, 4, 6]]
    t, h, w = grid[0].tolist()
    num_image_tokens = t * h * w // 4
    ids = list(vp.input_ids)
    start = ids.index(VISION_START)
    assert ids[start + 1 : start + 1 + num_image_tokens] == [IMAGE_PAD] * num_image_tokens
    assert ids[start + 1 + num_image_tokens] == VISION_END
    assert ids.count(IMAGE_PAD) == num_image_tokens
    tokenizer = processor.tokenizer
    assert ids[:start] == tokenizer.encode("<|im_start|>user\n", add_special_tokens=False)
    assert ids[start + 2 + num_image_tokens :] == tokenizer.encode(
        "How many?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    pixels = vp.train_inputs["pixel_values"]
    assert pixels.dtype == torch.float32 and pixels.shape == (t * h * w, 3 * 2 * patch * patch)
    assert set(vp.train_inputs) == {"pixel_values", "image_grid_thw"}


def test_engine_images_are_the_pixels_the_trainer_sees(vlm):
    """The image sent to the engine is already at the processor's size: processing it again gives the same
    grid and the same pixel values (so SGLang, running the same processor, expands the same number of tokens)."""
    from PIL import Image

    family, path = vlm
    patch = PATCH[family]
    image = "data:image/png;base64," + base64.b64encode(png_bytes(size=(101, 67), color=(30, 140, 220))).decode()
    text = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>hi<|im_end|>\n<|im_start|>assistant\n"
    vp = multimodal.prepare_vision_prompt(path, text, [image])
    (t, h, w) = vp.train_inputs["image_grid_thw"][0].tolist()
    sent = multimodal.decode_image(vp.engine_images[0])
    assert sent.size == (w * patch, h * patch) != (101, 67)
    again = multimodal.get_processor(path)(text=[text], images=[sent], return_tensors="pt")
    assert again["input_ids"][0].tolist() == list(vp.input_ids)
    assert torch.equal(again["pixel_values"], vp.train_inputs["pixel_values"])
    assert isinstance(sent, Image.Image)


# ---- data source rows -> samples -------------------------------------------------------------------------------


def _write_rows(tmp_path, rows, fmt):
    if fmt == "jsonl":
        path = tmp_path / "data.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_rows_become_samples_with_images_and_rendered_prompts(vlm, tmp_path, fmt):
    _, path = vlm
    raw = png_bytes()
    (tmp_path / "img.png").write_bytes(raw)
    if fmt == "jsonl":
        rows = [{"q": "<image>Count?", "a": "3", "images": ["img.png"]},
                {"q": "No image here.", "a": "0", "images": []}]  # fmt: skip
    else:  # Parquet with the Hugging Face datasets image struct
        rows = [{"q": "<image>Count?", "a": "3", "images": [{"bytes": raw, "path": "x.png"}]},
                {"q": "No image here.", "a": "0", "images": []}]  # fmt: skip
    data = _write_rows(tmp_path, rows, fmt)
    samples = rows_to_samples(
        load_prompt_rows(str(data)), source=str(data), input_key="q", label_key="a",
        tokenizer=multimodal.get_processor(path).tokenizer, apply_chat_template=True,
        multimodal_keys={"image": "images"}, processor_path=path,
    )  # fmt: skip
    assert [s.label for s in samples] == ["3", "0"]
    assert samples[0].prompt == (
        "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>Count?<|im_end|>\n<|im_start|>assistant\n"
    )
    want = str(tmp_path / "img.png") if fmt == "jsonl" else "data:image/png;base64," + base64.b64encode(raw).decode()
    assert samples[0].multimodal_inputs == {"images": [want]}
    assert samples[1].multimodal_inputs is None
    assert samples[1].prompt == "<|im_start|>user\nNo image here.<|im_end|>\n<|im_start|>assistant\n"


def test_a_text_only_row_holding_the_image_token_is_refused_naming_the_row(vlm, tmp_path):
    # A row without images whose text held "<|image_pad|>" was loaded; the engine and the trainer got an image token
    # without pixels, and packed next to a sample with images the trainer failed in transformers ("Image features and
    # image tokens do not match, tokens: 142, features: 140"), naming no row (seen on the CPU with qwen3-vl-tiny).
    _, path = vlm
    (tmp_path / "img.png").write_bytes(png_bytes())
    rows = [{"q": "<image>Count?", "a": "3", "images": ["img.png"]},
            {"q": "what is <|vision_start|><|image_pad|><|vision_end|> here?", "a": "0"}]  # fmt: skip
    data = _write_rows(tmp_path, rows, "jsonl")
    with pytest.raises(ValueError) as err:
        rows_to_samples(
            load_prompt_rows(str(data)), source=str(data), input_key="q", label_key="a",
            tokenizer=multimodal.get_processor(path).tokenizer, apply_chat_template=True,
            multimodal_keys={"image": "images"}, processor_path=path,
        )  # fmt: skip
    assert str(err.value) == (
        f"{data} line 2: the prompt holds the image token <|image_pad|> as text (1x) but the row has no image in the "
        "--multimodal-keys column 'images': give the image there with an <image> placeholder in the prompt, or "
        "remove the token"
    )


def test_max_prompt_len_counts_the_expanded_image_tokens(vlm, tmp_path):
    _, path = vlm
    rows = [{"q": "<image>?", "images": [png_bytes(size=(200, 200))]}, {"q": "<image>?", "images": [png_bytes()]}]
    common = dict(source=str(tmp_path / "d.jsonl"), input_key="q", tokenizer=multimodal.get_processor(path).tokenizer,
                  apply_chat_template=True, multimodal_keys={"image": "images"}, processor_path=path)  # fmt: skip
    # The 200x200 image is shrunk to the 8x8-patch maximum (16 tokens), the 40x30 one becomes 2x2 patches (1 token):
    # prompts of 27 and 12 tokens (11 template/text/vision-start/end tokens + the image tokens).
    kept = rows_to_samples(rows, max_prompt_len=26, **common)
    assert len(kept) == 1 and kept[0].multimodal_inputs["images"][0].startswith("data:image/png")
    assert len(rows_to_samples(rows, max_prompt_len=27, **common)) == 2
    assert rows_to_samples(rows, max_prompt_len=11, **common) == []


# ---- generate: the /generate request, held to what SGLang 0.5.16 does with it ----------------------------------


def image_tokens(family: str, height: int, width: int) -> int:
    """Tokens of one image for the tiny checkpoints (`make_tiny_vlm`: 2x2 to 8x8 patch grids, merge 2)."""
    patch = PATCH[family]
    h, w = _vl_rules.smart_resize(height, width, 2 * patch, (2 * patch) ** 2, (8 * patch) ** 2)
    return (h // patch) * (w // patch) // 4


def sglang_expand(family: str, payload: dict) -> list[int]:
    """The prompt SGLang 0.5.16 builds from `input_ids` + `image_data` (`base_processor.py` `_expand_input_ids`,
    after its processor ran on the decoded ids): the i-th `<|image_pad|>` becomes image i's tokens. Any other
    number of image tokens than one per image fails there (the processor expands every pad of the decoded text)."""
    ids, images = payload["input_ids"], [multimodal.decode_image(i) for i in payload["image_data"]]
    if ids.count(IMAGE_PAD) != len(images):
        raise AssertionError(f"SGLang rejects {ids.count(IMAGE_PAD)} image tokens for {len(images)} images")
    counts = iter(image_tokens(family, img.height, img.width) for img in images)
    return [t for token in ids for t in ([token] * next(counts) if token == IMAGE_PAD else [token])]


class SGLangLikeClient:
    """Answers every /generate with two tokens; `prompt_tokens` is the prompt SGLang would build (`sglang_expand`),
    or `prompt_tokens` when given."""

    def __init__(self, family, prompt_tokens=None):
        self.family = family
        self.payloads = []
        self.prompt_tokens = prompt_tokens

    async def generate(self, payload):
        self.payloads.append(payload)
        expanded = sglang_expand(self.family, payload)
        meta = {
            "output_token_logprobs": [[-0.5, 17, None], [-0.25, 151645, None]],
            "finish_reason": {"type": "stop", "matched": 151645},
            "prompt_tokens": self.prompt_tokens if self.prompt_tokens is not None else len(expanded),
            "weight_version": "3",
        }
        return {"text": "2<|im_end|>", "output_ids": [17, 151645], "meta_info": meta}


def _args(path):
    return PluginArgs.from_config(
        SlimeArgs.from_dict(
            {
                "rollout_batch_size": 1,
                "num_rollout": 1,
                "hf_checkpoint": path,
                "rollout_max_response_len": 4,
                "train_backend": "fsdp",
            }
        )  # fmt: skip
    )


PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>n?<|im_end|>\n<|im_start|>assistant\n"


def test_collapse_image_runs_keeps_one_token_per_image():
    s, p, e = VISION_START, IMAGE_PAD, VISION_END
    ids = [1, s, p, p, p, p, e, 2, s, p, e, 3, p, p, 4]
    # Runs after <|vision_start|> shrink to one token; image tokens elsewhere stay as they are.
    assert multimodal.collapse_image_runs(ids, p, s) == [1, s, p, e, 2, s, p, e, 3, p, p, 4]
    assert multimodal.collapse_image_runs([], p, s) == []


async def test_generate_sends_one_image_token_per_image_and_sglang_expands_it_back(vlm, monkeypatch):
    family, path = vlm
    client = SGLangLikeClient(family)
    monkeypatch.setattr(generate_mod, "get_client", lambda args: client)
    image = "data:image/png;base64," + base64.b64encode(png_bytes(size=(77, 45))).decode()
    samples = [Sample(prompt=PROMPT, multimodal_inputs={"images": [image]}, index=i) for i in range(2)]
    for s in samples:
        await generate_mod.generate(_args(path), s, {"max_new_tokens": 4, "temperature": 1.0})
    vp = multimodal.prepare_vision_prompt(path, PROMPT, [image])
    # 77x45 -> 84x56 (patch 14: a 4x6 grid, 6 tokens) or 64x32 (patch 16: 2x4, 2 tokens).
    n = {"qwen2_5_vl": 6, "qwen3_vl": 2}[family]
    assert n == image_tokens(family, 45, 77) == list(vp.input_ids).count(IMAGE_PAD)
    tokenizer = multimodal.get_processor(path).tokenizer
    for s, payload in zip(samples, client.payloads, strict=True):
        # The request holds the template's prompt as the tokenizer writes it: one <|image_pad|> for the image.
        assert payload["input_ids"] == tokenizer.encode(PROMPT, add_special_tokens=False) == list(vp.engine_input_ids)
        assert payload["image_data"] == list(vp.engine_images)
        assert payload["image_data"][0].startswith("data:image/png;base64,")
        # The sample holds what SGLang builds from that request, and the trainer trains on it.
        assert sglang_expand(family, payload) == list(vp.input_ids)
        assert s.tokens == [*vp.input_ids, 17, 151645] and s.response_length == 2
        assert s.rollout_log_probs == [-0.5, -0.25]
        assert torch.equal(s.multimodal_train_inputs["pixel_values"], vp.train_inputs["pixel_values"])
    # The group's samples share one processing (and its tensors).
    assert samples[0].multimodal_train_inputs["pixel_values"] is samples[1].multimodal_train_inputs["pixel_values"]


async def test_a_continuation_sends_the_collapsed_prompt_and_the_response_so_far(vlm, monkeypatch):
    family, path = vlm
    client = SGLangLikeClient(family)
    monkeypatch.setattr(generate_mod, "get_client", lambda args: client)
    image = "data:image/png;base64," + base64.b64encode(png_bytes(size=(90, 60))).decode()
    vp = multimodal.prepare_vision_prompt(path, PROMPT, [image])
    sample = Sample(prompt=PROMPT, multimodal_inputs={"images": [image]}, index=3)
    sample.tokens, sample.response_length = [*vp.input_ids, 30, 31], 2
    sample.loss_mask, sample.rollout_log_probs = [1, 1], [-1.0, -2.0]
    await generate_mod.generate(_args(path), sample, {"max_new_tokens": 6})
    (payload,) = client.payloads
    assert payload["input_ids"] == [*vp.engine_input_ids, 30, 31]
    assert payload["sampling_params"]["max_new_tokens"] == 4
    assert sample.tokens == [*vp.input_ids, 30, 31, 17, 151645] and sample.response_length == 4


async def test_a_response_holding_the_image_token_is_not_sent(vlm, monkeypatch, caplog):
    """SGLang would take an `<|image_pad|>` the policy sampled for one more image and fail the request: the sample
    stops where it is."""
    family, path = vlm
    client = SGLangLikeClient(family)
    monkeypatch.setattr(generate_mod, "get_client", lambda args: client)
    image = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()
    vp = multimodal.prepare_vision_prompt(path, PROMPT, [image])
    sample = Sample(prompt=PROMPT, multimodal_inputs={"images": [image]}, index=5)
    sample.tokens, sample.response_length = [*vp.input_ids, 30, IMAGE_PAD], 2
    sample.loss_mask, sample.rollout_log_probs = [1, 1], [-1.0, -2.0]
    out = await generate_mod.generate(_args(path), sample, {"max_new_tokens": 6})
    assert client.payloads == [] and out.status is Status.TRUNCATED
    assert out.tokens == [*vp.input_ids, 30, IMAGE_PAD] and out.response_length == 2
    assert "sample 5: its response holds the image placeholder token" in caplog.text


async def test_engine_that_expands_images_differently_is_an_error(vlm, monkeypatch):
    family, path = vlm
    monkeypatch.setattr(generate_mod, "get_client", lambda args: SGLangLikeClient(family, prompt_tokens=3))
    image = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()
    sample = Sample(prompt=PROMPT, multimodal_inputs={"images": [image]}, index=0)
    with pytest.raises(ValueError, match="the engine saw 3 prompt tokens, the processor made"):
        await generate_mod.generate(_args(path), sample, {"max_new_tokens": 4})


async def test_continuation_must_start_with_the_processor_prompt(vlm, monkeypatch):
    family, path = vlm
    monkeypatch.setattr(generate_mod, "get_client", lambda args: SGLangLikeClient(family))
    image = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()
    sample = Sample(prompt=PROMPT, tokens=[1, 2, 3], multimodal_inputs={"images": [image]}, index=7)
    with pytest.raises(ValueError, match="sample 7: its tokens do not start with the processor's"):
        await generate_mod.generate(_args(path), sample, {"max_new_tokens": 4})


def test_a_prompt_with_a_stray_image_token_is_refused(vlm):
    _, path = vlm
    image = "data:image/png;base64," + base64.b64encode(png_bytes()).decode()
    text = PROMPT.replace("n?", "n<|image_pad|>?")  # a placeholder outside <|vision_start|>: no image is meant
    with pytest.raises(ValueError, match=r"the prompt has 2 <\|image_pad\|> for 1 image\(s\)"):
        multimodal.prepare_vision_prompt(path, text, [image])
    with pytest.raises(ValueError, match=r"the prompt has 1 <\|image_pad\|> for 2 image\(s\)"):
        multimodal.prepare_vision_prompt(path, PROMPT, [image, image])
    # A placeholder the template did not put after <|vision_start|> cannot be told apart from text by an engine.
    bare = PROMPT.replace("<|vision_start|><|image_pad|>", "<|image_pad|>")
    big = "data:image/png;base64," + base64.b64encode(png_bytes(size=(90, 60))).decode()  # 2 tokens or more
    with pytest.raises(ValueError, match=r"every image placeholder must follow <\|vision_start\|>"):
        multimodal.prepare_vision_prompt(path, bare, [big])


def test_sample_images_of_text_only_samples_is_empty():
    assert multimodal.sample_images(Sample(prompt="x")) == []
    assert multimodal.image_column(None) is None
    assert multimodal.image_column({"image": "imgs"}) == "imgs"


def test_sample_images_from_plugins_pil_bytes_and_bad_types():
    # What the original's custom-generate plugins put in multimodal_inputs: PIL images (RGBA here).
    from PIL import Image

    pil = Image.new("RGBA", (20, 10), (1, 2, 3, 255))
    sample = Sample(prompt="x", index=4, multimodal_inputs={"images": [pil, png_bytes((5, 6)), "/abs/path.png"]})
    first, second, third = multimodal.sample_images(sample)
    decoded = multimodal.decode_image(first)
    assert decoded.size == (20, 10) and decoded.getpixel((3, 3)) == (1, 2, 3)
    assert multimodal.decode_image(second).size == (5, 6)
    assert third == "/abs/path.png"
    bad = Sample(prompt="x", index=9, multimodal_inputs={"images": ["/a.png", 12]})
    with pytest.raises(ValueError, match=r"sample 9 image 2: an image must be a path, bytes or base64 string, got int"):
        multimodal.sample_images(bad)


def test_to_dict_of_a_sample_with_pil_images_is_json_and_round_trips():
    # The partial-rollout buffer is saved with json.dumps(Sample.to_dict()): a PIL image must not break it.
    from PIL import Image

    sample = Sample(prompt="x", index=1, multimodal_inputs={"images": [Image.new("RGB", (7, 3), (9, 8, 7))]})
    back = Sample.from_dict(json.loads(json.dumps(sample.to_dict())))
    (uri,) = back.multimodal_inputs["images"]
    assert uri.startswith("data:image/png;base64,")
    image = multimodal.decode_image(uri)
    assert image.size == (7, 3) and image.getpixel((6, 2)) == (9, 8, 7)


def _png16(values) -> bytes:
    """A 16-bit grayscale PNG (Pillow opens it as mode "I;16") of `values` (uint16 rows)."""
    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.array(values, dtype=np.uint16)).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_16_bit_grayscale_image_is_scaled_to_8_bits_not_clipped():
    # Pass 48: Pillow's RGB conversion (and so transformers' convert_to_rgb) clips 16-bit values at 255, so a
    # 16-bit scan came out all white; scaled as a viewer shows it, round(v * 255 / 65535).
    import numpy as np
    from PIL import Image

    raw = _png16([[0, 257, 1000, 32768, 65535]])
    image = multimodal.decode_image(multimodal.normalize_image(raw, base_dir=None, where="row 1"))
    assert image.mode == "RGB"
    assert np.asarray(image)[0, :, 0].tolist() == [0, 1, 4, 128, 255]  # was [0, 255, 255, 255, 255]
    assert (np.asarray(image)[..., 0] == np.asarray(image)[..., 2]).all()  # gray: the three channels agree
    # A plugin's PIL image of that mode is sent the same way.
    pil = Image.open(io.BytesIO(raw))
    sample = Sample(index=0, multimodal_inputs={"images": [pil]})
    (uri,) = multimodal.sample_images(sample)
    assert np.asarray(multimodal.decode_image(uri))[0, :, 0].tolist() == [0, 1, 4, 128, 255]
    # 8-bit images are converted as before.
    assert np.asarray(multimodal.to_rgb(Image.new("L", (1, 1), 200)))[0, 0].tolist() == [200, 200, 200]


def test_base64_wrapped_over_lines_is_accepted():
    # Pass 48: base64 as the `base64` CLI writes it (76 columns, newlines) was refused as "neither a file nor
    # base64"; the standard decoder accepts it once the line breaks are taken out.
    raw = _png16([[0, 65535] * 40] * 3)
    wrapped = base64.encodebytes(raw).decode("ascii")  # 76-column lines, as the CLI writes them
    assert "\n" in wrapped.strip()
    expected = multimodal.normalize_image(raw, base_dir=None, where="row 1")
    assert multimodal.normalize_image(wrapped, base_dir=None, where="row 1") == expected
    assert multimodal.normalize_image("data:image/png;base64," + wrapped, base_dir=None, where="row 1") == expected
    with pytest.raises(ValueError, match="row 1: image .* is neither an existing file"):
        multimodal.normalize_image("not\nbase64!", base_dir=None, where="row 1")
