"""An `--hf-checkpoint` whose model type transformers does not know, refused before Ray starts (issue 27)."""

import json
import shutil

from slime_app.demo import default_demo_argv


def _model(tmp_path, **fields):
    model = tmp_path / "model"
    shutil.copytree(default_demo_argv(tmp_path)[1], model)  # the demo's --hf-checkpoint
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, **fields}))
    return model


def _argv(tmp_path, model):
    argv = default_demo_argv(tmp_path / "run")
    argv[argv.index("--hf-checkpoint") + 1] = str(model)
    return argv


def test_an_unknown_model_type_is_refused_before_ray_starts(tmp_path, cli_without_ray):
    model = _model(tmp_path, model_type="foo_bar", architectures=["FooBarForCausalLM"])
    out = cli_without_ray(_argv(tmp_path, model))
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.splitlines()[-1].startswith(
        f"slime: error: --hf-checkpoint {model}: config.json's model_type 'foo_bar' is not one transformers "
    )
    assert "Traceback" not in out.stderr


def test_a_model_with_its_own_code_is_not_refused_by_type(tmp_path):
    from slime_app.model_files import check_model_type

    check_model_type(str(_model(tmp_path, model_type="foo_bar", auto_map={"AutoConfig": "x.FooConfig"})))


def test_the_known_model_types_are_ones_transformers_builds():
    import transformers

    from slime_app.model_files import KNOWN_MODEL_TYPES

    assert KNOWN_MODEL_TYPES <= set(transformers.CONFIG_MAPPING), KNOWN_MODEL_TYPES - set(transformers.CONFIG_MAPPING)


def test_a_known_model_type_is_checked_without_importing_transformers(tmp_path):
    # The driver imported transformers (1.2 CPU-s on top of torch, in every run and preflight) only for this lookup.
    import subprocess
    import sys

    code = (
        "import sys\nfrom slime_app.model_files import check_model_type\n"
        f"check_model_type({str(_model(tmp_path))!r})\n"  # the demo's qwen3
        "print('transformers' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout == "False\n"
