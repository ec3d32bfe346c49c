"""Helpers shared by the data-source tests (registered by conftest.py as module `slime_data_source_helpers`)."""

import json

from slime_core.config import PluginArgs, SlimeArgs


def _args(**kw):
    """The plugin view a data source is built with (`cls(args)`)."""
    fields = dict(
        rollout_batch_size=1,
        num_rollout=1,
        input_key="question",
        label_key="answer",
        rollout_seed=42,
        n_samples_per_prompt=2,
    )
    fields.update(kw)
    return PluginArgs.from_config(SlimeArgs.from_dict(fields))


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


ROWS = [{"question": f"q{i}", "answer": str(i), "metadata": {"k": i}} for i in range(5)]
