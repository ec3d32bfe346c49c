"""`python -m slime_app.demo`: the demo's own command line."""

import subprocess
import sys


def test_demo_help_shows_the_demos_options_and_defaults():
    # `--help` went to slime-train's parser and printed the general help: no --output-dir default of the demo, and
    # the general defaults (`--train-backend ... (default: megatron)`) instead of the demo's.
    done = subprocess.run(
        [sys.executable, "-m", "slime_app.demo", "--help"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: python -m slime_app.demo [-h] [--output-dir DIR] [FLAGS ...]\n")
    assert "--output-dir DIR  directory of all the run's outputs (default: runs/demo without FLAGS" in done.stdout
    lines = done.stdout.splitlines()
    assert "  --train-backend fsdp" in lines and "  --save runs/demo/checkpoints" in lines
    assert "  --num-rollout 80" in lines
    assert "default: megatron" not in done.stdout
