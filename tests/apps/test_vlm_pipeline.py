"""Images from data to trainer and weights back to the engine, with the real pieces (no Ray):

JSONL rows with images → `RolloutDataSource` (processor chat template) → default `generate` over HTTP to a CPU
reference engine subprocess (`image_data`) → `build_rollout_batches` → `FSDPTrainBackend` (gloo, world 1):

1. first-step parity: the trainer's log-probs of the engine's samples equal the engine's own (fp32, 1e-5);
2. weight sync round trip: after a GRPO step the `TensorWeightUpdater` pushes `named_hf_weights()` (checkpoint
   names, every trainable parameter) into the engine; read back through `/get_weights_by_name` the engine holds
   exactly the trainer's tensors, and the trainer's log-probs of newly generated samples equal the engine's again;
3. with `--freeze-vision-tower` the second push carries no vision tensor and the parity still holds.

Both Qwen-VL families (tiny random checkpoints with the real Qwen tokenizer).
"""

import base64
import io
import json
import os
import pathlib
import random
import socket
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.train_data import build_rollout_batches

pytestmark = pytest.mark.slow

# The trainer runs a backward pass in this process, and autograd's worker threads make every later fork()-based
# multi-rank test of the same pytest process fail ("autograd ... fork"); so the outer run only starts a child
# pytest on this module, which runs the real tests.
_INNER = "SLIME_VLM_PIPELINE_INNER"
INNER = os.environ.get(_INNER) == "1"
REPO = pathlib.Path(__file__).resolve().parents[2]

LOGPROB_ATOL = 1e-5


def _png(size, color) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def process_group():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def setup(request, make_tiny_vlm, tmp_path_factory, process_group):
    from slime_rollout.engines.launch import launch_engines

    work = tmp_path_factory.mktemp(f"vlm-pipeline-{request.param}")
    ckpt = make_tiny_vlm(work / "ckpt", request.param)
    rows = [
        {
            "question": "<image>How many shapes?",
            "label": str(i % 3),
            "images": [_png((48 + 8 * i, 40), (40 * i, 90, 9))],
        }
        for i in range(4)
    ]
    data = work / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fields = dict(
        hf_checkpoint=str(ckpt), prompt_data=str(data), input_key="question", label_key="label",
        apply_chat_template=True, multimodal_keys={"image": "images"}, train_backend="fsdp", rollout_engine="reference",
        rollout_batch_size=4, n_samples_per_prompt=2, global_batch_size=8, micro_batch_size=4, num_rollout=2,
        rollout_max_response_len=5, rollout_temperature=1.0, lr=5e-3, seed=7, attn_implementation="sdpa",
        sglang_args={"num_threads": "1"},
    )  # fmt: skip
    cfg = SlimeArgs.from_dict(fields)
    group = launch_engines(cfg, num_engines=1, gpus_per_engine=1, startup_timeout_s=300, log_dir=work / "logs",
                           base_port=random.Random(os.getpid()).randrange(41000, 49000, 10))  # fmt: skip
    yield fields, group
    group.shutdown()


def _rollout(cfg: SlimeArgs, urls: list[str]) -> list:
    from slime_rollout.data.source import RolloutDataSource
    from slime_rollout.generation.generate import build_sampling_params, generate
    from slime_rollout.runtime import async_utils

    args = PluginArgs.from_config(cfg, engine_urls=urls)
    groups = RolloutDataSource(args).get_samples(cfg.rollout_batch_size)
    samples = [s for g in groups for s in g]
    params = build_sampling_params(cfg)

    async def run():
        import asyncio

        return await asyncio.gather(*(generate(args, s, params) for s in samples))

    samples = async_utils.run(run())
    for s in samples:
        s.reward = float(s.index % 2)  # any non-constant reward: GRPO gets non-zero advantages
    return samples


def _parity(backend, cfg, samples) -> float:
    batch = build_rollout_batches(cfg, samples, dp_size=1)[0]
    trainer = backend.compute_log_probs(batch)
    return max(float((a - b).abs().max()) for a, b in zip(trainer, batch.rollout_log_probs, strict=True)), batch


@pytest.mark.parametrize("freeze", [False, True])
def test_first_step_parity_and_weight_sync_round_trip(setup, freeze):
    from slime_rollout.engines.client import RolloutClient
    from slime_rollout.weight_sync.updaters import TensorWeightUpdater, run_sync
    from slime_train_fsdp import FSDPTrainBackend

    fields, group = setup
    cfg = SlimeArgs.from_dict({**fields, "freeze_vision_tower": freeze})
    backend = FSDPTrainBackend()
    backend.init(cfg, with_ref=False)
    client = RolloutClient(group.urls)
    try:
        _train_and_sync(cfg, backend, TensorWeightUpdater(cfg, client, load_format=None), group.urls, freeze)
    finally:
        run_sync(client.aclose())


def _train_and_sync(cfg, backend, updater, urls, freeze):
    from slime_core.hf_names import to_module_name

    updater.update(backend.named_hf_weights(), "0")  # the engine may hold another test's weights: start equal

    samples = _rollout(cfg, urls)
    assert all(s.multimodal_train_inputs is not None and s.response_length > 0 for s in samples)
    diff, batch = _parity(backend, cfg, samples)
    assert diff <= LOGPROB_ATOL, f"first-step trainer vs engine log-prob gap {diff}"

    backend.train(0, batch)
    pushed = []

    def recording(buckets):
        for bucket in buckets:
            pushed.extend(name for name, _ in bucket)
            yield bucket

    trained = {n: t.clone() for bucket in backend.named_hf_weights() for n, t in bucket}
    updater.update(recording(backend.named_hf_weights()), "1")
    assert any("visual" in n for n in pushed) is (not freeze)  # a frozen tower is pushed only once
    assert any("layers" in n for n in pushed)

    # Every trainable weight the engine serves was pushed (a frozen tower's were pushed by the first update).
    model_type = backend.config.model_type
    params = dict(backend.model.named_parameters())
    assert all(to_module_name(n, model_type) in params for n in trained)
    pushed_modules = {to_module_name(n, model_type) for n in pushed}
    assert {n for n, p in params.items() if p.requires_grad} <= pushed_modules

    # Round trip: the engine's checksums (SGLang's /weights_checker, SGLang's names) are those of the trainer's bytes.
    import httpx

    from slime_rollout.engines.weight_checksum import sglang_checksums

    want = sglang_checksums(trained.items(), dtype=torch.float32)  # the reference engine holds fp32
    with httpx.Client(base_url=urls[0], timeout=120) as http:
        resp = http.post("/weights_checker", json={"action": "checksum"})
        resp.raise_for_status()
        got = resp.json()["ranks"][0]["checksums"]
    assert {n: got.get(n) for n in want} == want

    # The engine now computes what the trainer computes: new samples' log-probs agree again.
    samples = _rollout(cfg, urls)
    diff, _ = _parity(backend, cfg, samples)
    assert diff <= LOGPROB_ATOL, f"after the weight sync, trainer vs engine log-prob gap {diff}"


if not INNER:
    del test_first_step_parity_and_weight_sync_round_trip

    def test_vlm_pipeline_in_a_child_pytest(tmp_path):
        cmd = [sys.executable, "-m", "pytest", str(pathlib.Path(__file__)), "-q", "-x", "-p", "no:cacheprovider",
               "--basetemp", str(tmp_path / "inner")]  # fmt: skip
        r = subprocess.run(cmd, env={**os.environ, _INNER: "1"}, cwd=REPO, capture_output=True, text=True, timeout=1500)
        assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-2000:]
        assert "4 passed" in r.stdout, r.stdout[-2000:]  # 2 model families x frozen/trained tower
