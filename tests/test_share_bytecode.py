""".ci/share_bytecode.py: the isolation runs of .ci/run reuse the full environment's bytecode, and nothing else."""

import importlib.util
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("slime_ci_share_bytecode", REPO / ".ci" / "share_bytecode.py")
share_bytecode = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(share_bytecode)


def _venv(root: pathlib.Path, packages: dict[str, str]) -> pathlib.Path:
    site = root / "lib" / "python3.12" / "site-packages"
    for name, source in packages.items():
        (site / name).mkdir(parents=True)
        (site / name / "__init__.py").write_text(source)
    return site


def test_bytecode_goes_only_where_the_package_is_and_what_is_there_stays(tmp_path):
    full = _venv(tmp_path / "full", {"declared": "X = 1\n", "undeclared": "Y = 2\n"})
    (full / "declared" / "sub").mkdir()
    (full / "declared" / "sub" / "__init__.py").write_text("")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(full)], check=True)
    iso = _venv(tmp_path / "iso", {"declared": "X = 1\n"})
    (iso / "declared" / "__pycache__").mkdir()
    own = iso / "declared" / "__pycache__" / "mine.pyc"
    own.write_bytes(b"kept")

    assert share_bytecode.share(full, iso) == 1  # declared/__init__'s .pyc; declared/sub is not in the target
    (pyc,) = (full / "declared" / "__pycache__").glob("__init__.*.pyc")
    assert os.stat(iso / "declared" / "__pycache__" / pyc.name).st_ino == os.stat(pyc).st_ino  # a link, not a copy
    assert own.read_bytes() == b"kept"
    assert not (iso / "undeclared").exists() and not (iso / "declared" / "sub").exists()
    # Run again: nothing left to link, nothing overwritten.
    assert share_bytecode.share(full, iso) == 0


def test_a_venv_without_one_site_packages_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"expected one lib/python3\*/site-packages, found \[\]"):
        share_bytecode.site_packages(tmp_path)
    site = _venv(tmp_path / "v", {"p": ""})
    assert share_bytecode.site_packages(tmp_path / "v") == site
