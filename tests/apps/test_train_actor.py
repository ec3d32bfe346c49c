"""The trainer actor builds the backend that `--train-backend` names, through each package's public export."""

import pathlib
import subprocess
import sys
import types

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "apps" / "train"))

from slime_app.train_actor import _make_backend  # noqa: E402


@pytest.mark.parametrize(
    ("name", "module", "cls"),
    [("fsdp", "slime_train_fsdp.backend", "FSDPTrainBackend"),
     ("megatron", "slime_train_megatron.backend", "MegatronTrainBackend")],
)  # fmt: skip
def test_make_backend_builds_the_named_backend(name, module, cls):
    backend = _make_backend(types.SimpleNamespace(train_backend=name))
    assert type(backend).__module__ == module and type(backend).__name__ == cls
    for method in ("init", "train", "compute_log_probs", "named_hf_weights", "sleep", "wake_up", "save"):
        assert callable(getattr(backend, method)), f"{cls} lacks {method}"


def test_make_backend_rejects_unknown_name():
    with pytest.raises(ValueError, match="--train-backend: unknown backend 'jax'"):
        _make_backend(types.SimpleNamespace(train_backend="jax"))


def test_megatron_export_names_the_extra_when_megatron_core_is_missing():
    # A fresh interpreter where `megatron` cannot be imported: the package still imports, the backend
    # export fails with the install line.
    code = (
        "import sys; sys.modules['megatron'] = None\n"
        "import slime_train_megatron\n"
        "try:\n"
        "    slime_train_megatron.MegatronTrainBackend\n"
        "except ImportError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "ERR MegatronTrainBackend needs megatron-core: pip install 'slime-train-megatron[megatron]'" in out.stdout
