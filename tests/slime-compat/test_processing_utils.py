"""`slime.utils.processing_utils`: the original's image helpers on a tiny Qwen2.5-VL processor.

The tiny processor (tests/conftest.py `make_tiny_vlm`) has patch 14, merge 2 and resizes images to between
28x28 and 112x112 pixels (multiples of 28), so the expected sizes and token counts below are computed by hand.
"""

import base64
import io

import pytest
import torch
from PIL import Image

from slime.utils.processing_utils import (
    build_processor_kwargs,
    encode_image_for_rollout_engine,
    load_processor,
    process_vision_info,
)
from slime_rollout.engines.reference.vision import decode_engine_image

IMAGE_PAD = 151655


@pytest.fixture(scope="module")
def vlm_dir(make_tiny_vlm, tmp_path_factory):
    return str(make_tiny_vlm(tmp_path_factory.mktemp("compat-vlm") / "vlm", "qwen2_5_vl"))


@pytest.fixture(scope="module")
def processor(vlm_dir):
    return load_processor(vlm_dir)


def gradient(size=(5, 3), mode="RGB"):
    """An image whose pixel (x, y) is (40x, 60y, 7) (alpha 128 in RGBA): every pixel differs."""
    img = Image.new("RGBA", size)
    img.putdata([(40 * x, 60 * y, 7, 128) for y in range(size[1]) for x in range(size[0])])
    return img.convert(mode)


def pixels(img):
    return [img.getpixel((x, y)) for y in range(img.size[1]) for x in range(img.size[0])]


def test_load_processor_is_the_processor_of_a_vl_checkpoint_and_none_otherwise(vlm_dir, processor, fixtures_dir):
    assert processor.image_processor.patch_size == 14
    assert load_processor(vlm_dir, use_fast=False).image_processor.patch_size == 14
    assert load_processor(str(fixtures_dir / "qwen3-tokenizer")) is None  # text-only: tokenizer, no processor
    assert load_processor("any/dir") is None


def test_a_folder_without_processor_files_is_none_without_asking_transformers(vlm_dir, fixtures_dir, monkeypatch):
    # Before: AutoProcessor.from_pretrained ran on the tokenizer-only checkpoint (17.6 s here, per process: the compat
    # GenerateState asks) only to come back with a bare tokenizer, turned into None. Now the folder's files say so.
    import transformers

    real = transformers.AutoProcessor.from_pretrained
    asked = []

    def recording(path, *args, **kwargs):
        asked.append(str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(transformers.AutoProcessor, "from_pretrained", recording)
    text_only = str(fixtures_dir / "qwen3-tokenizer")
    assert load_processor(text_only) is None and load_processor(text_only, use_fast=False) is None
    assert asked == []
    # A folder with a processor config still loads it (the same processor as before).
    assert load_processor(vlm_dir, use_fast=False).image_processor.patch_size == 14 and asked == [vlm_dir]


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L"])
def test_encode_image_gives_a_png_data_uri_the_reference_engine_reads(mode, tmp_path):
    img = gradient(mode=mode)
    uri = encode_image_for_rollout_engine(img)
    assert uri.startswith("data:image/png;base64,")
    assert Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1]))).format == "PNG"
    decoded = decode_engine_image(uri)
    assert decoded.size == (5, 3)
    # RGB conversion: RGBA drops alpha; L repeats its luminance.
    if mode == "L":
        assert pixels(decoded) == [(v, v, v) for v in pixels(img)]
    else:
        assert pixels(decoded) == [p[:3] for p in pixels(img)]
    # Sample.multimodal_inputs forms (a path, a data: URI) give the same URI as the PIL image.
    img.convert("RGB").save(tmp_path / "g.png")
    assert encode_image_for_rollout_engine(str(tmp_path / "g.png")) == encode_image_for_rollout_engine(uri) == uri


def test_encode_image_refuses_what_it_cannot_read(tmp_path):
    with pytest.raises(ValueError, match="image URLs are not fetched"):
        encode_image_for_rollout_engine("https://example.com/a.png")
    with pytest.raises(ValueError, match="neither an existing file"):
        encode_image_for_rollout_engine(str(tmp_path / "missing.png"))


def test_build_processor_kwargs_makes_the_processor_return_list_ids_and_tensors(processor):
    text = processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}], tokenize=False
    )
    big = gradient(size=(200, 100))
    given = {"images": [encode_image_for_rollout_engine(big)], "images_kwargs": {"do_rescale": True}}
    kwargs = build_processor_kwargs(given)
    assert given == {"images": [encode_image_for_rollout_engine(big)], "images_kwargs": {"do_rescale": True}}
    assert kwargs["images_kwargs"] == {"do_rescale": True, "return_tensors": "pt"}
    out = processor(text=text, **kwargs)
    # The original's contract: input ids as plain lists, vision outputs as tensors, no mm_token_type_ids.
    assert isinstance(out["input_ids"][0], list) and "mm_token_type_ids" not in out
    # 200x100 -> 196x112 exceeds 112*112 pixels -> 140x56: a 4x10 patch grid, 40 / 2² = 10 image tokens.
    assert out["image_grid_thw"].tolist() == [[1, 4, 10]]
    assert out["input_ids"][0].count(IMAGE_PAD) == 10
    reference = processor(text=[text], images=[big], return_tensors="pt")
    assert out["input_ids"][0] == reference["input_ids"][0].tolist()
    torch.testing.assert_close(out["pixel_values"], reference["pixel_values"], rtol=0, atol=0)


def test_build_processor_kwargs_without_media_and_with_video():
    assert build_processor_kwargs(None) == {
        "text_kwargs": {"return_tensors": None, "return_mm_token_type_ids": False},
        "audio_kwargs": {"return_tensors": "pt"},
        "images_kwargs": {"return_tensors": "pt"},
        "videos_kwargs": {"return_tensors": "pt"},
    }
    assert build_processor_kwargs({"images": None, "videos": None})["images"] is None  # process_vision_info's output
    with pytest.raises(ValueError, match="videos given; videos are not implemented"):
        build_processor_kwargs({"images": None, "videos": [[gradient()]]})


def test_process_vision_info_returns_images_at_the_processor_size(processor, tmp_path):
    gradient(size=(40, 30)).save(tmp_path / "small.png")
    big = gradient(size=(200, 100), mode="RGBA")
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": [
            {"type": "image", "image": encode_image_for_rollout_engine(big)},
            {"type": "text", "text": "and"},
            {"type": "image_url", "image_url": {"url": f"file://{tmp_path / 'small.png'}"}},
            {"type": "image", "image": big},
        ]},
    ]  # fmt: skip
    info = process_vision_info(messages, processor)
    assert info["videos"] is None
    # Hand-computed (multiples of 28 within 28²..112² pixels): 200x100 -> 140x56, 40x30 -> 28x28.
    assert [(img.mode, img.size) for img in info["images"]] == [
        ("RGB", (140, 56)),
        ("RGB", (28, 28)),
        ("RGB", (140, 56)),
    ]
    # At the processor's size already: processing them again keeps the size (grid × patch).
    grid = processor.image_processor(images=info["images"], return_tensors="pt")["image_grid_thw"]
    assert [(w * 14, h * 14) for _, h, w in grid.tolist()] == [img.size for img in info["images"]]
    assert pixels(info["images"][0]) == pixels(info["images"][2])  # the same image, as data: URI and as PIL
    assert process_vision_info("a text prompt", processor) == {"images": None, "videos": None}


def test_process_vision_info_errors(processor):
    video = [{"role": "user", "content": [{"type": "video", "video": "clip.mp4"}]}]
    with pytest.raises(ValueError, match="a video content part; videos are not implemented"):
        process_vision_info(video, processor)
    url = [{"role": "user", "content": [{"type": "image", "image": "http://example.com/a.png"}]}]
    with pytest.raises(ValueError, match="process_vision_info image 1: image URLs are not fetched"):
        process_vision_info(url, processor)
    with pytest.raises(ValueError, match="image part without an image"):
        process_vision_info([{"role": "user", "content": [{"type": "image"}]}], processor)
