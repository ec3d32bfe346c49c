"""`uv run apps/make_model --preset qwen3-tiny --out DIR`: the installed `slime_make_model` command line.

Presets: qwen3-tiny (a few MB, real Qwen3 vocab), qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b.
"""

from slime_make_model.cli import main

if __name__ == "__main__":
    main()
