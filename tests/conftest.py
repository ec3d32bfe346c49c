"""Shared test configuration: fixture paths and CPU-only defaults.

Kept free of package imports (slime_core only where installed) so each package's tests can run in isolation
(`uv run --exact --package <pkg> --group dev pytest tests/<pkg>`).
"""

import importlib.util
import os
import pathlib

import pytest

FIXTURES = pathlib.Path(__file__).parent / "fixtures"

# No hub access in tests: everything is built from config or read from tests/fixtures.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Inductor on CPU probes its base vector ISA by building a test kernel and loading it in a fresh interpreter that
# imports torch, in every process that compiles (the compile test's full-model case under load: 153 -> 133 CPU-s
# without it). The ISA is still the widest one /proc/cpuinfo lists (torch's `valid_vec_isa_list`); only that probe
# build is skipped (the probes of its extensions, VNNI, AMX, bf16, still run).
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
# Inductor compiles in a pool of subprocesses when the machine has 2+ cores; on a 2-core CI machine that already runs
# two xdist workers the pool's processes (each importing torch) cost more than they overlap. In-process compiling
# gives the same graphs and kernels (the compile test's full-model case, quiet machine: 80 -> 71 s, 82 -> 77 CPU-s).
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

# How the whole suite is spread over xdist workers (tests/_suite_plan.py): its hooks become this conftest's, and a
# worker process gets its own Ray temp root and engine ports before any test starts a run.
_spec = importlib.util.spec_from_file_location("slime_tests_suite_plan", FIXTURES.parent / "_suite_plan.py")
_suite_plan = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_suite_plan)
_suite_plan.apply_worker_env()
pytest_cmdline_main = _suite_plan.pytest_cmdline_main
pytest_xdist_auto_num_workers = _suite_plan.pytest_xdist_auto_num_workers
pytest_xdist_make_scheduler = _suite_plan.pytest_xdist_make_scheduler
pytest_sessionfinish = _suite_plan.pytest_sessionfinish
pytest_collection_modifyitems = _suite_plan.pytest_collection_modifyitems


# A config names a training backend (default `megatron`) whose capability record its validation reads. A package's
# tests in isolation have no backend installed: the providers' own record files (`spec.py`, importing only
# slime_core) are then loaded by path and registered in-process, so the same records decide in every run.
_BACKEND_RECORDS = {
    "slime_train_fsdp": ("slime-train-fsdp", "FSDP"),
    "slime_train_megatron": ("slime-train-megatron", "MEGATRON"),
}


def pytest_configure(config):
    import importlib.util
    import logging

    try:
        from slime_core.extensions import TRAIN_BACKENDS
    except ImportError:  # slime-convert's isolation run: no config here
        return
    loaded = []
    for package, (dist, attr) in _BACKEND_RECORDS.items():
        if importlib.util.find_spec(package) is not None:
            continue  # installed: its entry point serves the record
        path = pathlib.Path(__file__).resolve().parents[1] / "packages" / dist / "src" / package / "spec.py"
        spec = importlib.util.spec_from_file_location(f"_isolated_{package}_spec", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        TRAIN_BACKENDS.register(getattr(module, attr))
        loaded.append(dist)
    if loaded:
        logging.getLogger(__name__).warning("isolation run: backend records loaded from their files: %s", loaded)


@pytest.fixture(scope="session")
def fixtures_dir() -> pathlib.Path:
    """Path of tests/fixtures."""
    return FIXTURES


@pytest.fixture(scope="session")
def qwen3_tokenizer_dir() -> pathlib.Path:
    """Directory with the real Qwen3 tokenizer (tokenizer.json + tokenizer_config.json)."""
    return FIXTURES / "qwen3-tokenizer"


# Token ids of the real Qwen3 tokenizer: <|endoftext|> (bos, pad) and <|im_end|> (eos).
QWEN3_SPECIAL_IDS = {"bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643}


@pytest.fixture(scope="session")
def make_tiny_qwen3(qwen3_tokenizer_dir):
    """Factory `make_tiny_qwen3(out_dir, dtype=torch.float32, **config) -> out_dir`.

    Writes a random-weight Qwen3 (seed 0; 2 layers, hidden 64, 4 heads / 2 KV heads of 16, the full 151936-token
    vocab, tied embeddings unless overridden) with the real Qwen3 tokenizer files: a model directory that
    transformers, the reference engine, SGLang and the trainers all load.
    """
    import shutil

    def make(out_dir: pathlib.Path, dtype=None, **config) -> pathlib.Path:
        import torch
        from transformers import Qwen3Config, Qwen3ForCausalLM

        fields = dict(
            vocab_size=151936, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, tie_word_embeddings=True,
            **QWEN3_SPECIAL_IDS,
        )  # fmt: skip
        fields.update(config)
        torch.manual_seed(0)
        model = Qwen3ForCausalLM(Qwen3Config(**fields))
        if dtype is not None:
            model = model.to(dtype)
        model.save_pretrained(out_dir)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(qwen3_tokenizer_dir / name, pathlib.Path(out_dir) / name)
        return pathlib.Path(out_dir)

    return make


@pytest.fixture(scope="session")
def make_tiny_qwen3_moe(qwen3_tokenizer_dir):
    """Factory `make_tiny_qwen3_moe(out_dir, **config) -> out_dir`: a random-weight Qwen3-MoE (routing replay tests).

    Seed 0, fp32; 2 layers, hidden 64, 4 heads / 2 KV heads of 16, 8 experts of 32 with top-2 (renormalized, as
    Qwen3-MoE), tied embeddings, the full Qwen3 vocab and the real tokenizer files (the reference engine loads it).
    """
    import shutil

    def make(out_dir: pathlib.Path, **config) -> pathlib.Path:
        import torch
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        fields = dict(
            vocab_size=151936, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_experts=8,
            num_experts_per_tok=2, norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=2048, tie_word_embeddings=True,
            **QWEN3_SPECIAL_IDS,
        )  # fmt: skip
        fields.update(config)
        torch.manual_seed(0)
        model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**fields))
        with torch.no_grad():  # larger router weights than the init: routes then clearly depend on the token
            for layer in model.model.layers:
                layer.mlp.gate.weight.normal_(0.0, 0.5)
        model.save_pretrained(out_dir)
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(qwen3_tokenizer_dir / name, pathlib.Path(out_dir) / name)
        return pathlib.Path(out_dir)

    return make


# A compact Qwen2-VL-style chat template: string or part-list contents, one
# <|vision_start|><|image_pad|><|vision_end|> per image part (what the Qwen-VL processors expand).
QWEN_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _tiny_vlm_config(family: str):
    """Config of a tiny random Qwen-VL model with the real Qwen vocab (both families: head_dim 8, mrope 2+1+1)."""
    tokens = dict(
        image_token_id=151655, video_token_id=151656, vision_start_token_id=151652, vision_end_token_id=151653
    )
    text = dict(
        vocab_size=151936, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=2048, tie_word_embeddings=True,
        **{k: v for k, v in QWEN3_SPECIAL_IDS.items() if k != "pad_token_id"},
    )  # fmt: skip
    if family == "qwen2_5_vl":
        from transformers import Qwen2_5_VLConfig

        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 1, 1]}
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                      fullatt_block_indexes=[1])  # fmt: skip
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **tokens), 14
    if family == "qwen3_vl":
        from transformers import Qwen3VLConfig

        text["rope_parameters"] = {
            "rope_type": "default", "rope_theta": 5e6, "mrope_section": [2, 1, 1], "mrope_interleaved": True,
        }  # fmt: skip
        vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=32, patch_size=16,
                      spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
                      deepstack_visual_indexes=[0])  # fmt: skip
        return Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **tokens), 16
    raise ValueError(f"unknown family {family!r}")


@pytest.fixture(scope="session")
def make_tiny_vlm(qwen3_tokenizer_dir):
    """Factory `make_tiny_vlm(out_dir, family="qwen2_5_vl"|"qwen3_vl") -> out_dir`.

    Writes a random-weight (seed 0, fp32) tiny Qwen2.5-VL or Qwen3-VL checkpoint with the real Qwen tokenizer, a
    Qwen-VL chat template and the family's processor (images resized to 4-64 patches: 2x2 to 8x8 patch grids), as
    `save_pretrained` writes it: what transformers, the reference engine and the trainer load.
    """

    def make(out_dir: pathlib.Path, family: str = "qwen2_5_vl") -> pathlib.Path:
        import torch
        from transformers import AutoModelForImageTextToText, AutoTokenizer

        config, patch = _tiny_vlm_config(family)
        torch.manual_seed(0)
        model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
        model.save_pretrained(out_dir)
        tokenizer = AutoTokenizer.from_pretrained(qwen3_tokenizer_dir)
        tokenizer.chat_template = QWEN_VL_CHAT_TEMPLATE
        factor = 2 * patch
        image_kwargs = dict(patch_size=patch, merge_size=2, temporal_patch_size=2,
                            min_pixels=(2 * patch) ** 2, max_pixels=(8 * patch) ** 2)  # fmt: skip
        if family == "qwen2_5_vl":
            from transformers import Qwen2_5_VLProcessor, Qwen2VLImageProcessor
            from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

            processor = Qwen2_5_VLProcessor(
                image_processor=Qwen2VLImageProcessor(**image_kwargs), tokenizer=tokenizer,
                video_processor=Qwen2VLVideoProcessor(), chat_template=QWEN_VL_CHAT_TEMPLATE,
            )  # fmt: skip
        else:
            from transformers import Qwen2VLImageProcessor, Qwen3VLProcessor
            from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

            processor = Qwen3VLProcessor(
                image_processor=Qwen2VLImageProcessor(**image_kwargs), tokenizer=tokenizer,
                video_processor=Qwen3VLVideoProcessor(), chat_template=QWEN_VL_CHAT_TEMPLATE,
            )  # fmt: skip
        assert factor == 2 * processor.image_processor.patch_size
        processor.save_pretrained(out_dir)
        return pathlib.Path(out_dir)

    return make


@pytest.fixture
def fsync_and_rename_log(monkeypatch) -> list[tuple[str, ...]]:
    """Records, in order, every `os.fsync` (`("fsync", path)`) and `os.replace` (`("replace", src, dst)`) of the test.

    The calls still happen; durability tests assert that each file is flushed before the rename that publishes it.
    """
    import os

    events: list[tuple[str, ...]] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    return events


def _write_stub_weights(folder: pathlib.Path) -> pathlib.Path:
    import torch
    from safetensors.torch import save_file

    # A name no architecture field (slime_app.checkpoint_shapes) and no slime-convert mapping reads
    # (slime_convert.load_shapes), so any config.json agrees with it.
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({"stub.weight": torch.ones(4)}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="session")
def stub_weights():
    """`stub_weights(folder)`: puts a one-tensor `model.safetensors` into a config-only model folder.

    Preflight refuses an `--hf-checkpoint` without weights when engines or the trainer load it; checks that only
    read config.json and the tokenizer (dry runs of big models' configs) need a weights file to be present.
    """
    return _write_stub_weights
