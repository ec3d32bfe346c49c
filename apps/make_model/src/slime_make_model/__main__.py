"""`python -m slime_make_model --preset qwen3-tiny --out DIR` (same as `uv run apps/make_model`)."""

from slime_make_model.cli import main

main()
