"""`python -m slime_app [FLAGS]`: the trainer (same as `uv run apps/train`)."""

from slime_app.cli import entry_point

entry_point()
