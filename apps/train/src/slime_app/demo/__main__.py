"""The embedded demo with extra flags: `uv run python -m slime_app.demo [--output-dir DIR] [FLAGS]`.

FLAGS come after the demo's own (later flags win). `--output-dir DIR` moves all of the run's outputs (TensorBoard,
checkpoints, HF export, reward curve) under DIR; it defaults to `runs/demo` without FLAGS and to `runs/demo-variant`
with them, so a variant never overwrites the plain demo's results. E.g. LoRA RL on the demo:
`uv run python -m slime_app.demo --output-dir runs/demo-lora --lora-rank 8 --lora-alpha 16 --lr 4e-3`.
"""

import shlex
import sys

from slime_app.cli import main
from slime_app.demo import default_demo_argv

_HELP_FLAGS = ("-h", "--help")


def demo_help() -> str:
    """The demo's own `--help`: its options with their defaults, and the flags it runs with.

    `--help` went to slime-train's parser after the demo's flags, which printed the general help: no `--output-dir`
    default of the demo, and every other default shown was the general one (`--train-backend megatron`), not the
    demo's.

    Returns:
        The help text, ending in a newline.
    """
    lines = [
        "usage: python -m slime_app.demo [-h] [--output-dir DIR] [FLAGS ...]",
        "",
        __doc__.strip(),
        "",
        "options:",
        "  -h, --help        show this help message and exit",
        "  --output-dir DIR  directory of all the run's outputs (default: runs/demo without FLAGS, runs/demo-variant "
        "with them)",
        "  FLAGS             any slime-train flag (`uv run slime-train --help`); it overrides the demo's value",
        "",
        "the demo's flags (with the default --output-dir):",
    ]
    demo = default_demo_argv()
    starts = [i for i, arg in enumerate(demo) if arg.startswith("--")] + [len(demo)]
    lines += [f"  {shlex.join(demo[a:b])}" for a, b in zip(starts, starts[1:], strict=False)]
    return "\n".join(lines) + "\n"


def demo_argv(extra: list[str]) -> list[str]:
    """The demo's flags with the output directory of `extra` (`--output-dir DIR`), then the rest of `extra`.

    A `--num-epoch` in `extra` replaces the demo's `--num-rollout` (which would otherwise win over it).

    Raises:
        SystemExit: `--output-dir` without a value.
    """
    rest, output_dir = [], "runs/demo-variant" if extra else "runs/demo"
    it = iter(extra)
    for arg in it:
        if arg == "--output-dir":
            output_dir = next(it, None) or sys.exit("slime_app.demo: --output-dir needs a directory")
        elif arg.startswith("--output-dir="):
            output_dir = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    demo = default_demo_argv(output_dir)
    if any(arg == "--num-epoch" or arg.startswith("--num-epoch=") for arg in rest):
        # The demo's own --num-rollout would win over the user's --num-epoch (as in the original) and drop it.
        i = demo.index("--num-rollout")
        del demo[i : i + 2]
    return demo + rest


if __name__ == "__main__":
    if any(arg in _HELP_FLAGS for arg in sys.argv[1:]):
        sys.stdout.write(demo_help())
        sys.exit(0)
    sys.exit(main(demo_argv(sys.argv[1:])))
