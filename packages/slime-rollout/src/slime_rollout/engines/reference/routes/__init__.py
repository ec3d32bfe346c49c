"""The reference engine's HTTP routes by endpoint group, one FastAPI `APIRouter` per module.

`generate` (`/generate`, `/abort_request`), `control` (pause/continue, flush, memory release/resume), `weights`
(weight updates from disk, tensors and a broadcast group; version; checksums; reads), `lora` (adapter load/unload),
`info` (health, loads, model and server info). The state they share is `state.EngineState`, reached through
`request.app.state.engine`; `slime_rollout.engines.reference.server.build_app` assembles them.
"""
