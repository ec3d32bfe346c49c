"""The slime trainer assembled on Ray: rollout manager, trainer ranks, weight sync, the training loop.

Run it with `uv run apps/train [FLAGS]` (no flags: the embedded demo, `slime_app.demo`), `python -m slime_app`
or the `slime-train` script. Modules, in the order a run uses them: `cli` (flags, logging, exit codes),
`preflight` (config and data checks before anything starts), `cluster` (Ray and the placement group),
`rollout_manager` (engines, data source, rollout function), `engine_hosts` (each engine on its bundle's node),
`train_actor` (trainer ranks), `registry` (backends and weight-sync transports by name), `weights` (weight push),
`loop` (`Run.step`), `tracking` (metrics sink). Importing this package imports nothing heavy (no Ray, torch or
transformers).
"""
