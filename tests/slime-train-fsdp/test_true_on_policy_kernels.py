"""SGLang's own triton attention kernels, as `MirroredAttention` calls them, run on CPU by Triton's interpreter.

Checks the wiring the GPU path depends on (argument order, prefill requests with prefix 0, one decode request per
response position with SGLang's split count): the output equals SDPA in fp32 (tolerance 1e-5), a sequence's rows
do not depend on what is packed with it, and SGLang's unified prefill kernel gives the same rows with or without a
radix-cache prefix (the assumption that lets the trainer prefill every prompt from position 0).

Needs the SGLang 0.5.16 source: `SLIME_SGLANG_SRC` (a directory holding the `sglang` package), the staged
`SLIME_SGLANG_PYTHONPATH`, or an installed `sglang`. Only the four kernel files are used, under a stub
`sglang.srt.utils`, so SGLang's dependencies are not needed.
"""

import importlib.util
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

KERNEL_FILES = ("decode_attention.py", "extend_attention.py", "prefill_attention.py", "score_mod.py")


def _sglang_root() -> pathlib.Path | None:
    if os.environ.get("SLIME_SGLANG_SRC"):
        return pathlib.Path(os.environ["SLIME_SGLANG_SRC"]) / "sglang"
    for entry in os.environ.get("SLIME_SGLANG_PYTHONPATH", "").split(os.pathsep):  # the GPU machine's staged SGLang
        if entry and (pathlib.Path(entry) / "sglang").is_dir():
            return pathlib.Path(entry) / "sglang"
    spec = importlib.util.find_spec("sglang")
    return pathlib.Path(spec.origin).parent if spec and spec.origin else None


@pytest.fixture(scope="module")
def interpreted(tmp_path_factory):
    root = _sglang_root()
    if root is None or not (root / "kernels/ops/attention/extend_attention.py").is_file():
        pytest.skip("needs the SGLang 0.5.16 source (an installed sglang, or SLIME_SGLANG_SRC)")
    stub = tmp_path_factory.mktemp("sglang-stub")
    attn = stub / "sglang/kernels/ops/attention"
    attn.mkdir(parents=True)
    (stub / "sglang/srt").mkdir()
    for d in (stub / "sglang", stub / "sglang/kernels", stub / "sglang/kernels/ops", attn, stub / "sglang/srt"):
        (d / "__init__.py").touch()
    (stub / "sglang/srt/utils.py").write_text(
        "def is_hip():\n    return False\n\n\ndef is_cuda():\n    return False\n\n\n"
        "def is_gfx95_supported():\n    return False\n"
    )
    for name in KERNEL_FILES:
        shutil.copy(root / "kernels/ops/attention" / name, attn / name)
    env = dict(
        os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join([str(stub), os.environ.get("PYTHONPATH", "")])
    )
    script = pathlib.Path(__file__).with_name("_true_on_policy_interpret.py")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernels_compute_attention(interpreted):
    assert interpreted["max_diff_vs_sdpa"] <= 1e-5
    assert interpreted["max_splits"] == 3  # 20-token sequence, split tile 8: ceil(20 / 8)


def test_rows_do_not_depend_on_the_packing(interpreted):
    assert interpreted["batch_invariant"]


def test_prefill_rows_do_not_depend_on_a_cached_prefix(interpreted):
    assert interpreted["prefix_split_invariant"]
