"""Weight sync: push trainer weights into the engines and check what they hold.

Modules: `updaters` (tensor, distributed and disk updaters), `push` (one push: per-engine locks, version fence,
failures), `lora` (`--weight-sync lora`), `delta_sync` (`--update-weight-mode delta`), `check` (the engines'
per-parameter checksums against the trainer's, after a push). What both ends share lives in `slime_rollout.engines`:
`wire` (request bodies, payloads), `weight_checksum` and `weight_delta` (the delta codec).
"""
