"""The apps are installed workspace members: they import by name, from any directory, with no path set-up."""

import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def test_apps_import_by_name_from_another_directory(tmp_path):
    code = (
        "import sys\n"
        "import slime_app, slime_app.demo\n"
        "print(sorted(m for m in ('ray', 'torch', 'transformers') if m in sys.modules))\n"
        "import slime_app.cli, slime_app.loop, slime_make_model\n"
        "print(slime_app.__file__)\n"
        "print(slime_app.demo.MODEL_DIR.is_dir(), slime_app.demo.TRAIN_DATA.is_file())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_clean_env(), capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    heavy, module_file, assets = out.stdout.splitlines()
    assert heavy == "[]"  # the package and its demo import nothing heavy
    assert pathlib.Path(module_file).is_relative_to(REPO / "apps" / "train" / "src" / "slime_app")
    assert assets == "True True"  # the demo's model and data are package data


def test_python_m_slime_app_from_another_directory(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "slime_app", "--help"],
        cwd=tmp_path,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "--rollout-batch-size" in out.stdout


def test_no_sys_path_manipulation_in_the_tree():
    needle = "sys.path." + "insert"  # (split so that this file does not match itself)
    offenders = [
        str(path.relative_to(REPO))
        for folder in ("apps", "benchmarks", "tests", "packages")
        for path in (REPO / folder).rglob("*")
        if path.suffix in (".py", ".sh") and needle in path.read_text(errors="replace")
    ]
    assert offenders == []
