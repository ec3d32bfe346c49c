"""Random-weight Qwen3 and Qwen3-VL checkpoints in Hugging Face format, with the real Qwen3 tokenizer.

Presets use the published Qwen3 shapes (hidden size, layers, heads, KV heads, head_dim 128, FFN size,
rope theta 1e6, tied embeddings up to 4B). Weights are drawn tensor by tensor from N(0, 0.02²) (norm
weights are ones and biases zeros, like ``Qwen3PreTrainedModel._init_weights``) and streamed into safetensors
shards, so peak memory is one shard, not the whole model. No network access is needed.

A Qwen3-MoE preset (``qwen3-moe-tiny``) draws its router weights from N(0, ``MoePreset.router_std``²), so routes
depend on the token. A Qwen3-VL preset (``qwen3-vl-tiny``) also gets the processor files and a Qwen-VL chat template
(`slime_make_model.vl_files`): a directory that SGLang, the CPU reference engine and the FSDP trainer load.
"""

import json
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import (
    GenerationConfig,
    PretrainedConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
)

from slime_make_model.presets import (
    DEFAULT_TOKENIZER_DIR,
    PRESETS,
    QWEN3_BOS_ID,
    QWEN3_EOS_ID,
    QWEN3_VOCAB_SIZE,
    TOKENIZER_FILES,
)
from slime_make_model.vl_files import vl_config_dict, write_vl_files

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _new_file_mode() -> int:
    # What open() gives a new file; this CLI is single-threaded, so reading the umask by setting it is safe here.
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def preset_config(name: str, dtype: str = "bfloat16", vocab_size: int = QWEN3_VOCAB_SIZE) -> PretrainedConfig:
    """Returns the ``Qwen3Config`` of a preset (``Qwen3MoeConfig`` with experts, ``Qwen3VLConfig`` with a vision tower).

    Args:
        name: A key of :data:`PRESETS`.
        dtype: Checkpoint dtype name recorded in the config (``float32``/``bfloat16``/``float16``).
        vocab_size: Embedding rows (Qwen3 pads its 151669-token vocab to 151936).

    Raises:
        ValueError: Unknown preset or dtype.
    """
    if name not in PRESETS:
        raise ValueError(f"--preset {name!r} is unknown; choose one of {sorted(PRESETS)}")
    if dtype not in DTYPES:
        raise ValueError(f"--dtype {dtype!r} is unknown; choose one of {sorted(DTYPES)}")
    p = PRESETS[name]
    if p.vision is not None:
        return Qwen3VLConfig.from_dict(vl_config_dict(p, dtype, vocab_size))
    moe_fields = {}
    if p.moe is not None:
        moe_fields = dict(
            num_experts=p.moe.num_experts,
            num_experts_per_tok=p.moe.num_experts_per_tok,
            moe_intermediate_size=p.moe.moe_intermediate_size,
            norm_topk_prob=True,
        )
    return (Qwen3MoeConfig if p.moe is not None else Qwen3Config)(
        vocab_size=vocab_size,
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_hidden_layers,
        num_attention_heads=p.num_attention_heads,
        num_key_value_heads=p.num_key_value_heads,
        head_dim=p.head_dim,
        max_position_embeddings=p.max_position_embeddings,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        hidden_act="silu",
        attention_bias=False,
        tie_word_embeddings=p.tie_word_embeddings,
        bos_token_id=QWEN3_BOS_ID,
        eos_token_id=QWEN3_EOS_ID,
        initializer_range=0.02,
        dtype=dtype,
        **moe_fields,
    )


def _model_class(config: PretrainedConfig) -> type:
    if isinstance(config, Qwen3VLConfig):
        return Qwen3VLForConditionalGeneration
    return Qwen3MoeForCausalLM if isinstance(config, Qwen3MoeConfig) else Qwen3ForCausalLM


# transformers >= 5 holds an MoE block's experts fused: `experts.gate_up_proj` [E, 2*I, H], `experts.down_proj`
# [E, H, I].
_FUSED_EXPERTS = re.compile(r"(?P<prefix>.*\.experts)\.(?P<proj>gate_up_proj|down_proj)")


def _stored_shapes(name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """A model parameter as the checkpoint names it: fused experts become one matrix per expert.

    Published Qwen3-MoE checkpoints, SGLang's loader and slime's shape check name them so
    (`experts.{e}.gate_proj.weight` `[I, H]`); written fused, the preset was refused by slime
    ("...experts.0.gate_proj.weight is missing").
    """
    m = _FUSED_EXPERTS.fullmatch(name)
    if m is None or len(shape) != 3:
        return [(name, shape)]
    experts, rows, cols = shape
    if m["proj"] == "down_proj":
        return [(f"{m['prefix']}.{e}.down_proj.weight", (rows, cols)) for e in range(experts)]
    half = (rows // 2, cols)  # gate rows, then up rows
    return [(f"{m['prefix']}.{e}.{proj}.weight", half) for e in range(experts) for proj in ("gate_proj", "up_proj")]


def parameter_shapes(config: PretrainedConfig) -> dict[str, tuple[int, ...]]:
    """Returns ``{name: shape}`` of the tensors a checkpoint stores, built on the meta device (no memory).

    A tied ``lm_head.weight`` is omitted: it is the embedding. MoE experts are named per expert, as on disk
    (`_stored_shapes`), not fused as transformers holds them in memory.
    """
    with torch.device("meta"):
        model = _model_class(config)(config)
    shapes = dict(pair for n, t in model.state_dict().items() for pair in _stored_shapes(n, tuple(t.shape)))
    if config.tie_word_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def count_parameters(config: PretrainedConfig) -> int:
    """Number of distinct parameters (tied embeddings counted once)."""
    return sum(int(torch.Size(s).numel()) for s in parameter_shapes(config).values())


def _random_tensor(
    name: str, shape: tuple[int, ...], std: float, gen: torch.Generator, dtype: torch.dtype, router_std: float
):
    # Norm scales (RMSNorm, and the vision tower's LayerNorms: norm1, norm2, merger norms) start at one, biases at
    # zero; every other weight is drawn from N(0, std^2).
    module, _, kind = name.rpartition(".")
    if "norm" in module.rpartition(".")[2]:
        return torch.ones(shape, dtype=dtype) if kind == "weight" else torch.zeros(shape, dtype=dtype)
    if kind == "bias":
        return torch.zeros(shape, dtype=dtype)
    if name.endswith(".mlp.gate.weight"):  # a MoE router `[num_experts, hidden]`
        std = router_std
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen).to(dtype)


def write_random_weights(
    config: PretrainedConfig, out_dir: Path, seed: int, max_shard_bytes: int, router_std: float | None = None
) -> list[str]:
    """Streams random weights into ``model[-0000i-of-0000n].safetensors`` (+ index json when sharded).

    ``router_std``: std of MoE router weights (``*.mlp.gate.weight``); None draws them like the others.

    Returns:
        The shard file names written.
    """
    dtype = DTYPES[str(config.dtype).removeprefix("torch.")]
    std = config.get_text_config().initializer_range
    router_std = std if router_std is None else router_std
    shapes = parameter_shapes(config)
    itemsize = torch.empty((), dtype=dtype).element_size()
    # Plan shards first so file names can carry the shard count.
    plan: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = torch.Size(shape).numel() * itemsize
        if plan[-1] and size + nbytes > max_shard_bytes:
            plan.append([])
            size = 0
        plan[-1].append(name)
        size += nbytes
    n = len(plan)
    files = ["model.safetensors"] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    gen = torch.Generator().manual_seed(seed)
    weight_map, total = {}, 0
    for fname, names in zip(files, plan, strict=True):
        shard = {nm: _random_tensor(nm, shapes[nm], std, gen, dtype, router_std) for nm in names}
        save_file(shard, str(out_dir / fname), metadata={"format": "pt"})
        os.chmod(out_dir / fname, _new_file_mode())  # safetensors >= 0.8 leaves 0600 (safetensors#782)
        total += sum(t.numel() * t.element_size() for t in shard.values())
        weight_map.update(dict.fromkeys(names, fname))
        logger.info("wrote %s (%d tensors)", fname, len(names))
        del shard
    if n > 1:
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return files


def make_model(
    preset: str,
    out: Path,
    tokenizer_dir: Path = DEFAULT_TOKENIZER_DIR,
    dtype: str = "bfloat16",
    seed: int = 0,
    max_shard_gb: float = 4.0,
) -> Path:
    """Writes a complete random-weight HF checkpoint directory.

    The directory is assembled under a temporary sibling and renamed into place, so ``out`` either holds a
    complete checkpoint or does not exist. A Qwen3-VL preset also gets the processor files and the Qwen-VL chat
    template (`slime_make_model.vl_files.write_vl_files`).

    Args:
        preset: A key of :data:`PRESETS`.
        out: Destination directory; must not exist yet.
        tokenizer_dir: Directory holding the Qwen3 tokenizer files.
        dtype: Weight dtype (``float32``/``bfloat16``/``float16``).
        seed: Seed of the weight generator.
        max_shard_gb: Largest shard size in GB (1e9 bytes).

    Returns:
        ``out``.

    Raises:
        FileExistsError: ``out`` exists.
        FileNotFoundError: ``tokenizer_dir`` has no ``tokenizer.json``.
        ValueError: Unknown preset or dtype.
    """
    out, tokenizer_dir = Path(out), Path(tokenizer_dir)
    config = preset_config(preset, dtype)
    if out.exists():
        raise FileExistsError(f"--out {out} already exists; choose a new directory")
    if not (tokenizer_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"--tokenizer {tokenizer_dir} has no tokenizer.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    tmp.chmod(0o755)  # mkdtemp creates 0700; a checkpoint dir should be readable like any other
    try:
        if PRESETS[preset].vision is not None:
            write_vl_files(tmp, PRESETS[preset], tokenizer_dir, dtype)
        else:
            config.architectures = [_model_class(config).__name__]
            config.save_pretrained(tmp)
            for f in TOKENIZER_FILES:
                if (tokenizer_dir / f).is_file():
                    shutil.copyfile(tokenizer_dir / f, tmp / f)
        GenerationConfig(
            bos_token_id=QWEN3_BOS_ID,
            eos_token_id=[QWEN3_EOS_ID, QWEN3_BOS_ID],
            pad_token_id=QWEN3_BOS_ID,
            do_sample=True,
            temperature=0.6,
            top_p=0.95,
            top_k=20,
        ).save_pretrained(tmp)
        moe = PRESETS[preset].moe
        write_random_weights(config, tmp, seed, int(max_shard_gb * 1e9), moe.router_std if moe else None)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    logger.info("%s: %s, %.3fB parameters", out, preset, count_parameters(config) / 1e9)
    return out
