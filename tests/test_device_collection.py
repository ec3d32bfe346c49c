"""The GPU tests collect on the GPU machine, where the trainer's Python path lacks the SGLang server's packages.

There, FastAPI, uvicorn, Starlette, the OpenAI SDK and SGLang itself live on the SGLang server's path only, and
`pytest -m "gpu or sglang or megatron"` imports every test module before it selects: one module importing
one of them unguarded stops the whole GPU run at collection (seen twice, with `fastapi` and `openai`). This test
collects the suite in a subprocess where importing those packages fails, as it does there.
"""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Installed for the SGLang server only on the GPU machine (its image's trainer venv has torch and transformers).
SERVER_ONLY = ("fastapi", "uvicorn", "starlette", "openai", "sglang")

_COLLECT = textwrap.dedent(
    """
    import importlib.abc, sys
    blocked = set(sys.argv[1].split(","))

    class ServerOnly(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.partition(".")[0] in blocked:
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)

    sys.meta_path.insert(0, ServerOnly())
    import pytest
    sys.exit(pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider",
                          "-m", "gpu or sglang or megatron", "tests"]))
    """
)


@pytest.mark.slow
def test_gpu_tests_collect_without_the_sglang_servers_packages():
    proc = subprocess.run(
        [sys.executable, "-c", _COLLECT, ",".join(SERVER_ONLY)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    errors = [line for line in proc.stdout.splitlines() if line.startswith("ERROR ")]
    assert proc.returncode == 0 and not errors, (
        "test modules that import a server-only package unguarded (use pytest.importorskip):\n"
        + "\n".join(errors)
        + "\n"
        + proc.stdout[-3000:]
    )
    # The selection itself is not empty: the GPU tests are there to run.
    assert " tests collected" in proc.stdout and not proc.stdout.strip().endswith("no tests collected")
