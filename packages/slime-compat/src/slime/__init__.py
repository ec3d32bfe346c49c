"""The original slime's import paths for plugin authors, backed by this slime.

Plugins written for THUDM/slime import `from slime.utils.types import Sample`,
`from slime.utils.http_utils import post`, `from slime.rollout.sglang_rollout import GenerateState`, ...
These modules give those names with the original semantics; each is a re-export of this project's
implementation (`slime_core`, `slime_rollout`) or a thin adapter where the original's call shape differs.
Nothing here is the training stack of the original (no `slime.ray`; of `slime.agent` only the OpenAI adapter; of
`slime.backends` only the loss helpers TIS/MIS plugins import: `slime.backends.megatron_utils.loss` and `.cp_utils`):
importing any other fails with `ModuleNotFoundError`, and `MIGRATION.md` says what to use instead.
"""
