"""slime trainer command line: `uv run apps/train [FLAGS]` (also `python -m slime_app`, `slime-train`).

`--async` for one-step-ahead rollouts. With no flags it runs the embedded demo: GRPO on a bundled arithmetic
task and a tiny Qwen3-architecture model, on CPU (reference engine + FSDP on gloo), and prints
`eval accuracy: <first> -> <last>`. Flags are the original slime's (`--rollout-batch-size`,
`--advantage-estimator`, `--sglang-*`, ...); `--config run.yaml` reads the same fields from YAML.
"""

from __future__ import annotations

import logging
import os
import sys
import time

# Before anything imports ray: workers must run in this venv, not in a uv environment Ray builds itself.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# Per-engine and per-rank lines (pids, node addresses, URLs) differ only in numbers; Ray's log dedup would print the
# first one and fold the others into "[repeated Nx across cluster]".
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

from slime_app import interrupts  # noqa: E402 - after the environment above (it imports no ray)


def main(argv: list[str], *, keep_signal_handlers: bool = False) -> int:
    """Parses the flags, runs the loop, tears down; returns the exit code.

    SIGTERM and SIGINT stop the run cleanly while it runs (`slime_app.interrupts`); the handlers they had before
    are put back on return, unless `keep_signal_handlers` (the console script, which exits next: a copy of the
    signal `uv run` forwards late must still find them).

    Exit codes: 0 done, 2 bad flags/config/data (a damaged --load included, a layout the local node cannot hold) or an
    unwritable output folder, 1 an engine failed or user code ran past its deadline (one line) or an unexpected error
    (its traceback), 3 stopped by a run-health check, 4 the local Ray node did not start (or a cluster did not place
    the run's placement group in time), 5 a checkpoint, HF export or disk weight
    push could not be written, 128 + the signal's number when SIGTERM (143) or SIGINT/Ctrl-C (130) stopped it
    (`slime_app.interrupts`).
    """
    previous = interrupts.install()
    try:
        return _main(argv)
    finally:
        if not keep_signal_handlers:
            interrupts.restore(previous)


def _main(argv: list[str]) -> int:
    from slime_core.config import ConfigError, parse_args

    logging.basicConfig(
        level=os.environ.get("SLIME_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("httpx", "matplotlib"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    if "-h" in argv or "--help" in argv:
        _print_help()
        return 0
    demo = not argv or argv == ["--dry-run"]  # `--dry-run` alone checks the demo's flags (it said a flag was missing)
    if demo:
        from slime_app.demo import default_demo_argv

        dry = argv == ["--dry-run"]
        argv = default_demo_argv() + (["--dry-run"] if dry else [])
        what = "checking" if dry else "running"
        print(f"slime: no flags given, {what} the embedded demo (GRPO on a tiny model, CPU)", flush=True)
    try:
        cfg = parse_args(argv)
        if cfg.dry_run:
            from slime_app.dry_run import dry_run

            print("\n".join(dry_run(cfg, argv)))
            return 0
        from slime_app.disk_space import check_free_space
        from slime_app.outputs import (
            check_places,
            check_writable,
            foreign_iteration_warning,
            later_iterations_warning,
            reused_save_warning,
        )
        from slime_app.preflight import preflight
        from slime_app.ray_start import ray_address
        from slime_app.resolve import resolve_config
        from slime_app.run_lock import lock_run_folders

        for note in preflight(cfg):
            logging.getLogger("slime_app.preflight").info("%s", note)
        for warning in (reused_save_warning(cfg), later_iterations_warning(cfg), foreign_iteration_warning(cfg)):
            if warning:
                logging.getLogger("slime_app.outputs").warning("%s", warning)
        cfg, resolved = resolve_config(cfg)
        for note in resolved:
            logging.getLogger("slime_app.resolve").info("%s", note)
        if not ray_address(cfg):
            # On a cluster the trainer ranks write from other hosts: this host's view of the paths says little.
            check_writable(cfg)
            check_free_space(cfg)  # a save that cannot fit failed after the first rollout
            lock_run_folders(cfg)
        else:  # a save into the model folder the engines read is refused wherever the ranks run
            check_places(cfg, filesystems=False)
    # ImportError: PluginError; OSError: an unreadable file or tokenizer; TypeError: a data source without len().
    except (ConfigError, ValueError, OSError, ImportError, TypeError) as e:
        print(f"slime: error: {' '.join(str(e).split())}{_demo_hint(argv)}", file=sys.stderr)
        return 2

    from slime_app.actor_watch import ActorStopped
    from slime_app.cluster import PlacementError, PlacementTimeout
    from slime_app.failures import (
        SaveFailed,
        actor_failure,
        deadline_failure,
        engine_failure,
        interrupted_resume_line,
        memory_failure,
        plugin_failure,
    )
    from slime_app.guards import RunStopped, StartRefused
    from slime_app.loop import Run
    from slime_app.outputs import remove_cut_saves
    from slime_app.ray_start import RayAddressError, RayStartupError
    from slime_app.run_lock import release_run_folders

    started = time.perf_counter()
    run, interrupted = None, False
    try:
        run = Run(cfg)
        run.run()
        outputs = run.finish()
    except KeyboardInterrupt:  # SIGTERM too (slime_app.interrupts); `finally` stops engines, actors and Ray
        print(interrupts.interrupted_line(), file=sys.stderr, flush=True)
        interrupted = True
        return interrupts.exit_status()
    except RunStopped as e:
        print(f"slime: stopped: {e}", file=sys.stderr)
        return 3
    except (RayStartupError, RayAddressError, PlacementTimeout) as e:
        print(f"slime: error: {e}", file=sys.stderr)
        return 4
    except SaveFailed as e:
        print(f"slime: error: {e}", file=sys.stderr)
        return 5
    except ActorStopped as e:  # a trainer rank or the rollout manager stayed stopped (SIGSTOP): names it
        print(f"slime: error: {e}", file=sys.stderr)
        return 1
    except (StartRefused, PlacementError) as e:
        print(f"slime: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:
        line = (
            engine_failure(e, cfg)
            or deadline_failure(e)
            or actor_failure(e)
            or plugin_failure(e)
            or memory_failure(e, cfg)
        )
        if line is None:
            raise
        logging.getLogger("slime_app.cli").debug("the run's failure", exc_info=e)
        print(f"slime: error: {line}", file=sys.stderr)
        return 1
    finally:
        if run is not None:
            run.close()
        if not ray_address(cfg):  # the locks are held (see above): no save is writing there now
            for staging in remove_cut_saves(cfg):
                print(f"slime: removed {staging}: a save cut short, never a checkpoint", file=sys.stderr, flush=True)
        release_run_folders()  # after the last write of the run (an in-process caller may start another)
        # After the teardown: a save the signal cut is either committed by now or never will be.
        if interrupted and (resume := interrupted_resume_line(cfg.save)):
            print(f"slime: {resume}", file=sys.stderr, flush=True)
    wall = time.perf_counter() - started
    evals = run.tracker.eval_series()
    for name, series in evals.items():
        print(f"{name}: " + ", ".join(f"{v:.3f}@{s}" for s, v in series))
    if evals:
        first_series = next(iter(evals.values()))
        if len(first_series) > 1:
            print(f"eval accuracy: {first_series[0][1]:.3f} -> {first_series[-1][1]:.3f}")
        else:
            print(f"eval accuracy: {first_series[0][1]:.3f} (one eval)")
    if run.goodput.num_rollouts:
        print(run.goodput.summary())
    print(f"wall time: {wall:.0f} s")
    for label, path in outputs.items():
        print(f"{label}: {path}")
    return 0


#: The app's line of `--help` (the flags' parser is slime_core's, which knows no demo).
DEMO_HELP = (
    "With no flags at all, `uv run apps/train` runs the embedded demo (GRPO on a tiny model, CPU); to run it with "
    "some flags changed: `uv run python -m slime_app.demo FLAGS`."
)


def _print_help() -> None:
    """The flags' help (`slime_core.config.build_parser`) with the app's demo line added to its description."""
    import copy

    from slime_core.config import build_parser

    parser = copy.copy(build_parser())  # the cached parser stays as it is; only this copy's description changes
    parser.description = f"{parser.description} {DEMO_HELP}"
    parser.print_help()


def _demo_hint(argv: list[str]) -> str:
    """A pointer to `python -m slime_app.demo` when flags came without a model: a user changing the demo's flags.

    `uv run apps/train` alone runs the demo; `uv run apps/train --num-rollout 3` is a run of one's own, which then
    failed on the first missing flag (--rollout-batch-size) with no word that the demo's flags were not applied.
    """
    given = {arg.split("=", 1)[0] for arg in argv}
    if given & {"--hf-checkpoint", "--config"}:
        return ""
    return (
        " (flags without --hf-checkpoint: the embedded demo runs only with no flags at all; to run it with changed"
        " flags: uv run python -m slime_app.demo FLAGS)"
    )


def entry_point() -> None:
    """The `slime-train` console script: `main` on the command line's flags, exiting with its code."""
    try:
        code = main(sys.argv[1:], keep_signal_handlers=True)
    except KeyboardInterrupt:  # before the run was built (flags, preflight, dry run): nothing to tear down
        print(interrupts.interrupted_line().removesuffix(", shutting down"), file=sys.stderr, flush=True)
        code = interrupts.exit_status()
    sys.exit(code)
