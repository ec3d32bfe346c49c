"""`--lora-target-modules` against the model: a name no linear layer has is refused, before the run and in the trainer.

peft adapts the names it finds and drops the others without a word: on Qwen3-MoE (transformers fuses the experts
into one parameter, no `gate_proj`/`up_proj`/`down_proj` linear layers) the default targets trained the attention
only, while SGLang was started for MLP adapters too. Models are built from config on the meta device.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3MoeConfig

from slime_core.config import SlimeArgs
from slime_core.extensions import train_backend_spec
from slime_train_fsdp.lora import inject_lora, is_adapter
from slime_train_fsdp.preflight import lora_preflight

SMALL = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=8)  # fmt: skip
MOE = Qwen3MoeConfig(intermediate_size=64, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2, **SMALL)
DENSE = Qwen3Config(intermediate_size=64, **SMALL)
MOE_MESSAGE = (
    "--lora-target-modules gate_proj up_proj down_proj: no linear layer of this Qwen3MoeForCausalLM is named so (it "
    "has q_proj, k_proj, v_proj, o_proj); adapt only those"
)


def _cfg(path, **fields) -> SlimeArgs:
    base = {"rollout_batch_size": 1, "num_rollout": 1, "train_backend": "fsdp", "lora_rank": 4, "hf_checkpoint": path}
    return SlimeArgs.from_dict({**base, **fields})


def _meta_model(config):
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def test_the_trainer_refuses_targets_the_model_lacks_instead_of_adapting_the_rest():
    with pytest.raises(ValueError) as e:
        inject_lora(_meta_model(MOE), _cfg(None))  # the default targets
    assert str(e.value) == MOE_MESSAGE
    model = inject_lora(_meta_model(MOE), _cfg(None, lora_target_modules=["q_proj", "v_proj"]))
    adapted = {n.split(".")[-4] for n, p in model.named_parameters() if p.requires_grad}
    assert adapted == {"q_proj", "v_proj"}
    assert all(is_adapter(n) for n, p in model.named_parameters() if p.requires_grad)


def test_preflight_refuses_them_before_anything_starts(tmp_path):
    MOE.save_pretrained(tmp_path / "moe")  # config.json is all it reads
    DENSE.save_pretrained(tmp_path / "dense")
    (problem,) = lora_preflight(_cfg(str(tmp_path / "moe")))
    assert problem.message == MOE_MESSAGE and problem.severity == "error"
    assert train_backend_spec(_cfg(str(tmp_path / "moe"))).check(_cfg(str(tmp_path / "moe"))) == [problem]  # wired
    assert lora_preflight(_cfg(str(tmp_path / "moe"), lora_target_modules=["q_proj", "k_proj", "v_proj"])) == []
    assert lora_preflight(_cfg(str(tmp_path / "dense"))) == []
    assert lora_preflight(_cfg(str(tmp_path / "moe"), lora_rank=0)) == []


def test_the_backends_preflight_module_is_light_to_import():
    # The driver runs it on every FSDP run: it imported model_loading (torch's DCP, transformers' model classes, the
    # attention kernels), ~5 CPU-s of the driver's start-up spent on imports no later driver code needed.
    code = (
        "import sys; from slime_core.extensions import TRAIN_BACKENDS; import slime_train_fsdp.preflight\n"
        "from slime_core.registry import resolve_path\n"
        "resolve_path(TRAIN_BACKENDS.get('fsdp').preflight, what='fsdp preflight')\n"
        "heavy = ['slime_train_fsdp.model_loading', 'torch.distributed.checkpoint', 'transformers.modeling_utils']\n"
        "print([m for m in heavy if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
