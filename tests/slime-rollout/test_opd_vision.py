"""On-policy distillation of a vision-language student: the teacher scores the sample with its images.

The teacher is the CPU reference engine on a tiny random Qwen3-VL checkpoint (in process, through FastAPI's
`TestClient`); its log-probs are checked against an independent transformers forward of the whole sequence with the
processor's pixel values. Tolerance 1e-5 (fp32 engine vs one unpadded forward, different summation order).
"""

import asyncio
import base64
import io

import pytest
import torch
from transformers import AutoModelForImageTextToText

pytest.importorskip("fastapi", reason="the reference engine's HTTP app needs fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from slime_core.config import PluginArgs, SlimeArgs  # noqa: E402
from slime_core.sample import Sample, Status  # noqa: E402
from slime_rollout.data import multimodal  # noqa: E402
from slime_rollout.engines.reference.model import ReferenceModel  # noqa: E402
from slime_rollout.engines.reference.server import build_app  # noqa: E402
from slime_rollout.generation import opd  # noqa: E402

ATOL = 1e-5
TEMPERATURE = 0.8
IMAGE_PAD = 151655
URL = "http://teacher.invalid:1/generate"
PROMPT = "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>n?<|im_end|>\n<|im_start|>assistant\n"


def _png(size, color) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def vl_dir(make_tiny_vlm, private_tmp):
    path = private_tmp / "opd-vlm-qwen3_vl"
    if not path.exists():
        make_tiny_vlm(path, "qwen3_vl")
    return str(path)


class _InProcessTeacher:
    """`HttpEndpoint.request` answered by a reference engine app in this process; records the payloads."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.payloads: list[dict] = []

    async def request(self, method, route, payload=None, **kwargs):
        self.payloads.append(payload)
        reply = self.client.post(route, json=payload)
        assert reply.status_code == 200, reply.text
        return reply.json()


@pytest.fixture()
def teacher(vl_dir, monkeypatch):
    app = build_app(ReferenceModel(vl_dir), max_running_requests=4, random_seed=0, server_args={})
    with TestClient(app) as client:
        endpoint = _InProcessTeacher(client)
        monkeypatch.setitem(opd._endpoints, URL, (endpoint, "/generate"))
        yield endpoint


def _args(vl_dir, **kw) -> PluginArgs:
    fields = dict(
        rollout_batch_size=1, num_rollout=1, hf_checkpoint=vl_dir, train_backend="fsdp", use_opd=True,
        opd_type="sglang", rm_url=URL, rollout_temperature=TEMPERATURE,
    )  # fmt: skip
    return PluginArgs.from_config(SlimeArgs.from_dict(fields | kw))


def _sample(vl_dir, image: str, response: list[int], index: int = 0) -> Sample:
    vp = multimodal.prepare_vision_prompt(vl_dir, PROMPT, [image])
    return Sample(
        prompt=PROMPT, multimodal_inputs={"images": [image]}, tokens=[*vp.input_ids, *response],
        response_length=len(response), loss_mask=[1] * len(response), status=Status.COMPLETED, index=index,
    )  # fmt: skip


def _hf_log_probs(vl_dir, sample: Sample) -> torch.Tensor:
    """Log-probs of the response under transformers, with the processor's pixels (independent of the engine)."""
    vp = multimodal.prepare_vision_prompt(vl_dir, PROMPT, multimodal.sample_images(sample))
    hf = AutoModelForImageTextToText.from_pretrained(vl_dir, dtype=torch.float32).eval()
    ids = torch.tensor([sample.tokens])
    with torch.no_grad():
        logits = hf(
            input_ids=ids, pixel_values=vp.train_inputs["pixel_values"],
            image_grid_thw=vp.train_inputs["image_grid_thw"],
            mm_token_type_ids=(ids == IMAGE_PAD).long(),
        ).logits[0, sample.prompt_length - 1 : -1].float() / TEMPERATURE  # fmt: skip
    targets = torch.tensor(sample.response_tokens)
    return torch.log_softmax(logits, -1)[torch.arange(len(targets)), targets]


def test_builtin_scoring_sends_the_images_and_matches_transformers(vl_dir, teacher):
    image = _png((90, 60), (200, 30, 30))
    sample = _sample(vl_dir, image, [17, 30, 151645])
    assert asyncio.run(opd.score_teacher(_args(vl_dir), [sample])) == 1
    (payload,) = teacher.payloads
    vp = multimodal.prepare_vision_prompt(vl_dir, PROMPT, [image])
    # As the rollout's own request: one <|image_pad|> per image, the image as image_data.
    assert payload["input_ids"] == [*vp.engine_input_ids, 17, 30, 151645]
    assert payload["image_data"] == list(vp.engine_images)
    torch.testing.assert_close(torch.tensor(sample.teacher_log_probs), _hf_log_probs(vl_dir, sample), atol=ATOL, rtol=0)


def test_the_original_reward_func_sends_the_images_too(vl_dir, teacher):
    image = _png((40, 70), (10, 200, 10))
    sample = _sample(vl_dir, image, [40, 41])
    reply = asyncio.run(opd.reward_func(_args(vl_dir), sample))
    vp = multimodal.prepare_vision_prompt(vl_dir, PROMPT, [image])
    assert teacher.payloads[0]["image_data"] == list(vp.engine_images)
    assert isinstance(reply, dict)
    torch.testing.assert_close(torch.tensor(sample.teacher_log_probs), _hf_log_probs(vl_dir, sample), atol=ATOL, rtol=0)


def test_a_response_holding_the_image_token_is_refused_naming_the_sample(vl_dir, teacher):
    sample = _sample(vl_dir, _png((40, 40), (1, 2, 3)), [40, IMAGE_PAD], index=7)
    with pytest.raises(ValueError, match=r"sample 7: its response holds the image placeholder token"):
        asyncio.run(opd.score_teacher(_args(vl_dir), [sample]))
    assert teacher.payloads == []
