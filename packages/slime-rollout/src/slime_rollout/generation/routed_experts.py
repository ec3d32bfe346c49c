"""Rollout side of `--use-rollout-routing-replay`: the request flag and the reply's routes kept on the sample.

The functions live in `slime_core.reply_routes` (so `Sample.append_response_tokens` can keep a reply's routes as the
original's does); re-exported here for the rollout's generate functions.
"""

from __future__ import annotations

from slime_core.reply_routes import ROUTED_EXPERTS_REQUEST, attach_routed_experts, wants_routed_experts

__all__ = ["ROUTED_EXPERTS_REQUEST", "attach_routed_experts", "wants_routed_experts"]
