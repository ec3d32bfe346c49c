"""The CPU reference engine on tiny random Qwen2.5-VL / Qwen3-VL checkpoints (fp32), in process.

Log-probs are checked against an independent transformers forward of the whole sequence: transformers derives the
3-D rotary positions itself (`mm_token_type_ids`), without padding or KV cache. Tolerance 1e-5 (fp32, different
summation order).
"""

import base64
import io

import pytest
import torch
from transformers import AutoModelForImageTextToText

# The engine's HTTP app needs fastapi, which the trainer side of the staged GPU machine lacks (SGLang has its own):
# skip there instead of failing the collection of every GPU test.
pytest.importorskip("fastapi", reason="the reference engine's HTTP app needs fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from slime_rollout.engines.reference.model import ReferenceModel  # noqa: E402
from slime_rollout.engines.reference.request import GenRequest  # noqa: E402
from slime_rollout.engines.reference.sampling import SamplingParams  # noqa: E402
from slime_rollout.engines.reference.server import build_app  # noqa: E402
from slime_rollout.engines.reference.vision import decode_engine_image  # noqa: E402

LOGPROB_ATOL = 1e-5
IMAGE_PAD = 151655
PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def vlm(request, make_tiny_vlm, private_tmp):
    path = private_tmp / f"engine-vlm-{request.param}"
    if not path.exists():
        make_tiny_vlm(path, request.param)
    engine = ReferenceModel(str(path))
    hf = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return engine, hf


def png(size, color) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def request(engine, rid, ids, images, n=6, seed=0, temperature=0.8):
    vision = None
    if images:
        ids, vision = engine.vision.prepare(ids, None, [decode_engine_image(i) for i in images])
    sp = SamplingParams(temperature=temperature, max_new_tokens=n, ignore_eos=True)
    return GenRequest(rid=rid, input_ids=ids, params=sp, generator=torch.Generator().manual_seed(seed), vision=vision)


def hf_logprobs(hf, r, temperature=0.8):
    ids = torch.tensor([r.input_ids + r.output_ids])
    kwargs = {}
    if r.vision is not None:
        kwargs = dict(pixel_values=r.vision.pixel_values, image_grid_thw=r.vision.image_grid_thw,
                      mm_token_type_ids=(ids == IMAGE_PAD).long())  # fmt: skip
    with torch.no_grad():
        logits = hf(input_ids=ids, **kwargs).logits[0, len(r.input_ids) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1)[torch.arange(len(r.output_ids)), torch.tensor(r.output_ids)]


def unexpanded(engine):
    return engine.tokenizer.encode(PROMPT, add_special_tokens=False)


def test_image_rows_and_text_rows_in_one_left_padded_batch_match_transformers(vlm):
    engine, hf = vlm
    text_ids = engine.tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n", add_special_tokens=False)
    reqs = [
        request(engine, "big", unexpanded(engine), [png((120, 90), (250, 10, 10))], seed=1),
        request(engine, "small", unexpanded(engine), [png((30, 30), (10, 10, 250))], seed=2),
        request(engine, "text", text_ids, [], seed=3),
    ]
    assert len({len(r.input_ids) for r in reqs}) == 3  # rows of different lengths: left padding is exercised
    engine.generate(reqs)
    for r in reqs:
        assert len(r.output_ids) == 6
        torch.testing.assert_close(torch.tensor(r.output_logprobs), hf_logprobs(hf, r), atol=LOGPROB_ATOL, rtol=0)


def test_an_image_request_joining_a_running_batch_is_exact(vlm):
    engine, _ = vlm
    specs = [("a", [png((60, 40), (0, 200, 0))], 10, 1), ("b", [png((40, 70), (90, 0, 90))], 4, 2)]
    alone = []
    for rid, images, n, seed in specs:
        r = request(engine, rid, unexpanded(engine), images, n=n, seed=seed)
        engine.generate([r])
        alone.append(r)
    a, b = (request(engine, rid, unexpanded(engine), images, n=n, seed=seed) for rid, images, n, seed in specs)
    calls = []

    def take_new(k):
        calls.append(k)
        return [b] if len(calls) == 3 else []

    engine.generate([a], take_new=take_new, max_batch=4)
    for r, ref in zip((a, b), alone, strict=True):
        assert r.output_ids == ref.output_ids
        torch.testing.assert_close(torch.tensor(r.output_logprobs), torch.tensor(ref.output_logprobs),
                                   atol=LOGPROB_ATOL, rtol=0)  # fmt: skip


def test_ids_and_text_with_one_placeholder_per_image_give_the_same_prompt(vlm):
    engine, _ = vlm
    image = decode_engine_image(png((90, 50), (1, 2, 3)))
    from_text, vision = engine.vision.prepare(None, PROMPT, [image])
    from_ids, _ = engine.vision.prepare(unexpanded(engine), None, [image])
    t, h, w = vision.image_grid_thw[0].tolist()
    assert from_text == from_ids
    assert from_ids.count(IMAGE_PAD) == t * h * w // 4 == 6
    start = from_ids.index(IMAGE_PAD)
    assert from_ids[:start] + [IMAGE_PAD] + from_ids[start + 6 :] == unexpanded(engine)  # expanded in place


def test_image_tokens_other_than_one_per_image_are_rejected_as_sglang_does(vlm):
    """SGLang 0.5.16 decodes `input_ids` to text and its processor turns every `<|image_pad|>` into one whole image:
    ids already expanded by the client (6 pads for one image), an image token the policy sampled in an earlier
    turn, or more images than placeholders all fail there, so the stand-in refuses them too."""
    engine, _ = vlm
    image = decode_engine_image(png((90, 50), (1, 2, 3)))
    expanded, _ = engine.vision.prepare(unexpanded(engine), None, [image])
    cases = [
        (expanded, [image], "input_ids hold 6 image token\\(s\\) for 1 image\\(s\\)"),
        ([*unexpanded(engine), 17, IMAGE_PAD, 23], [image], "input_ids hold 2 image token\\(s\\) for 1 image"),
        (unexpanded(engine), [image, image], "input_ids hold 1 image token\\(s\\) for 2 image\\(s\\)"),
    ]
    for ids, images, message in cases:
        with pytest.raises(ValueError, match=message):
            engine.vision.prepare(ids, None, images)
    text = engine.tokenizer.decode(expanded)
    with pytest.raises(ValueError, match="the text has 6 <\\|image_pad\\|> for 1 image"):
        engine.vision.prepare(None, text, [image])


def test_http_generate_with_image_data_and_weight_updates_by_checkpoint_name(vlm):
    engine, _ = vlm
    app = build_app(engine, max_running_requests=4, random_seed=0, server_args={})
    with TestClient(app) as client:
        body = {"input_ids": unexpanded(engine), "image_data": [png((64, 64), (9, 9, 9))], "return_logprob": True,
                "sampling_params": {"max_new_tokens": 3, "temperature": 0.0}}  # fmt: skip
        reply = client.post("/generate", json=body).json()
        assert reply["meta_info"]["prompt_tokens"] == len(unexpanded(engine)) - 1 + 4  # 4 tokens for 4x4 patches
        assert len(reply["meta_info"]["output_token_logprobs"]) == 3
        assert client.get("/model_info").json()["has_image_understanding"] is True
        bad = client.post("/generate", json={**body, "image_data": ["bm90IGFuIGltYWdl"]})
        assert bad.status_code == 400 and "not a readable image" in bad.json()["error"]["message"]
    # Checkpoint names (what trainers push and SGLang loads) reach the right module parameters.
    checkpoint_name = "visual.blocks.0.norm1.weight" if engine.model_type == "qwen2_5_vl" else None
    module_name = "model.visual.blocks.0.norm1.weight"
    old = engine.model.state_dict()[module_name].clone()
    new = torch.full_like(old, 0.5)
    assert engine.weights.load_named_tensors([(checkpoint_name or module_name, new)]) == 1
    assert torch.equal(engine.model.state_dict()[module_name], new)
    engine.weights.load_named_tensors([(module_name, old)])  # module names are accepted too
    assert torch.equal(engine.model.state_dict()[module_name], old)
    with pytest.raises(KeyError, match="unknown parameter"):
        engine.weights.load_named_tensors([("visual.nope.weight", new)])


def test_checkpoint_names_check_by_sglangs_names(vlm):
    """As SGLang for Qwen-VL: /get_weights_by_name answers 400, /weights_checker lists the vision tower under
    SGLang's names (`visual.*`, `attn.qkv_proj`) with the checksum of the bytes pushed by checkpoint name."""
    from slime_rollout.engines.weight_checksum import sglang_param_name, tensor_checksum

    engine, _ = vlm
    checkpoint_name = "visual.blocks.0.attn.qkv.weight" if engine.model_type == "qwen2_5_vl" else None
    module_name = "model.visual.blocks.0.attn.qkv.weight"
    name = checkpoint_name or module_name
    old = engine.model.state_dict()[module_name].clone()
    new = torch.randn(old.shape, generator=torch.Generator().manual_seed(3))
    app = build_app(engine, max_running_requests=4, random_seed=0, server_args={})
    try:
        with TestClient(app) as client:
            engine.weights.load_named_tensors([(name, new)])
            refused = client.post("/get_weights_by_name", json={"name": name, "truncate_size": 3})
            assert refused.status_code == 400
            assert refused.json() == {"error": {"message": "Get parameter by name failed"}}
            checksums = client.post("/weights_checker", json={"action": "checksum"}).json()["ranks"][0]["checksums"]
            sglang_name = sglang_param_name(name)[0]
            assert sglang_name == "visual.blocks.0.attn.qkv_proj.weight"
            assert checksums[sglang_name] == tensor_checksum(new.to(engine.model.dtype))
    finally:
        engine.weights.load_named_tensors([(module_name, old)])
