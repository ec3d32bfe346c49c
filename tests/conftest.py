"""Shared test configuration: fixture paths and CPU-only defaults.

Kept free of package imports so each package's tests can run in isolation
(`uv run --exact --package <pkg> --group dev pytest tests/<pkg>`).
"""

import os
import pathlib

import pytest

FIXTURES = pathlib.Path(__file__).parent / "fixtures"

# No hub access in tests: everything is built from config or read from tests/fixtures.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
