"""`uv run apps/train [FLAGS]`: runs the installed trainer, `slime_app` (see `slime_app.cli`).

With no flags it runs the embedded demo (`slime_app.demo`): GRPO on a bundled arithmetic task and a tiny
Qwen3-architecture model, on CPU, ending with `eval accuracy: <first> -> <last>`.
"""

from slime_app.cli import entry_point

if __name__ == "__main__":
    entry_point()
