"""What the rollout runs on and reports through: the asyncio loop, bounded waits, metrics and dumps.

Modules: `async_utils` (the background event loop), `deadlines` and `loop_watchdog` (bounded waits on user code and
engines), `metrics` and `goodput` (`rollout/*`, `goodput/*`), `log_hooks` (custom metric loggers), `debug_dump`
(`--save-debug-rollout-data` / `--load-debug-rollout-data`).
"""
