"""Summarizes a finished `apps/train` run from its TensorBoard events as one JSON line.

`python3 benchmarks/e2e_report.py RUN_OUTPUT_DIR --rollout-batch-size 32 --n 8 [--skip-first 1]`

Per phase (perf/rollout_time, perf/train_time, perf/critic_train_time (PPO), perf/update_weights_time,
perf/step_time): the value of every step and the median over the steps after `--skip-first` warm-up steps; PPO's
critic explained variance / value loss and OPD's reverse KL: first and last value. Generated tokens per step =
rollout_batch_size · n · rollout/response_len/mean; overall tokens/s = Σ tokens / Σ step_time over the
same steps.

While the trainer's compile warm-up still runs (`slime_train_fsdp.compile_warmup`), its steps run eagerly and log
`perf/compile_warmup_pending`; the step after it ended loads the graphs (`perf/compile_time`). A short run can end
before that. So a run that logged an eager step also reports `steps_eager` and, over the measured steps that ran
compiled and loaded nothing (`steps_compiled`), `tokens_per_s_compiled`: the steady state of a longer run.
"""

from __future__ import annotations

import argparse
import pathlib

import _common  # sibling module: a script's own directory is first on sys.path

PHASES = (
    "perf/rollout_time",
    "perf/train_time",
    "perf/critic_train_time",
    "perf/update_weights_time",
    "perf/step_time",
)
# Algorithm curves recorded first/last when the run logs them (PPO's critic, on-policy distillation).
CURVES = ("train/critic-explained_variance", "train/critic-value_loss", "train/opd_reverse_kl")
# Reported when the run logged them: the colocated swaps, the trainer's peak memory, the weight-sync check.
EXTRA = (
    "perf/engine_release_time", "perf/wake_up_time", "perf/sleep_time",
    "perf/engine_resume_weights_time", "perf/engine_resume_kv_cache_time", "perf/train_peak_mem_gib",
    "perf/log_probs_time", "perf/actor_train_time", "perf/weight_check_time", "perf/compile_time",
    "perf/compiled_graphs", "perf/compile_cache_hits", "perf/compile_cache_misses", "perf/compile_warmup_wait_time",
    "perf/compile_warmup_pending",
    "perf/compile_warmup_finished",
    # The fully-async rollout (slime_rollout.generation.fully_async): versions behind per rollout, groups dropped
    # as stale.
    "rollout/staleness_mean", "rollout/staleness_p90", "rollout/staleness_max", "rollout/stale_groups_dropped",
    "perf/fully_async_wait_time",
)  # fmt: skip


def read_scalars(tb_dir: pathlib.Path) -> dict[str, dict[int, float]]:
    """All scalars of a TensorBoard directory as {tag: {step: value}}.

    Raises:
        FileNotFoundError: no event file under `tb_dir`.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not any(tb_dir.rglob("events.out.tfevents.*")):
        raise FileNotFoundError(f"no TensorBoard event file under {tb_dir}")
    acc = EventAccumulator(str(tb_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def summarize(scalars: dict[str, dict[int, float]], *, rollout_batch_size: int, n: int, skip_first: int) -> dict:
    """Per-phase medians and overall tokens/s (see the module docstring)."""
    steps = sorted(scalars.get("perf/step_time", {}))
    if not steps:
        raise ValueError("the run logged no perf/step_time (did it finish a rollout?)")
    kept = steps[skip_first:] or steps
    out: dict = {"steps": steps, "steps_measured": kept}
    for tag in PHASES:
        values = scalars.get(tag, {})
        out[tag] = {"all": [values.get(s) for s in steps],
                    "median": _common.median([values[s] for s in kept if s in values]) if values else None}  # fmt: skip
    for tag in EXTRA:
        values = scalars.get(tag, {})
        measured = [values[s] for s in kept if s in values]  # e.g. the weight check: logged at the first sync only
        if values:
            out[tag] = {"all": [values.get(s) for s in steps],
                        "median": _common.median(measured) if measured else None}  # fmt: skip
    # The first-step trainer-vs-rollout log-prob gap (issue 22's accuracy gate): the first logged train step.
    gap = scalars.get("train/train_rollout_logprob_abs_diff", {})
    if gap:
        out["first_step_logprob_abs_diff"] = gap[min(gap)]
    # The weight-content check (issue 25): engine tensors actually compared, over every checked sync.
    checked = scalars.get("weight_check/tensors_checked", {})
    out["weight_check_tensors_checked"] = int(sum(checked.values())) if checked else 0
    for tag in CURVES:
        values = scalars.get(tag, {})
        if values:
            out[tag] = {"first": values[min(values)], "last": values[max(values)]}
    lengths = scalars.get("rollout/response_len/mean", {})
    if lengths:
        tokens = sum(rollout_batch_size * n * lengths[s] for s in kept if s in lengths)
        seconds = sum(scalars["perf/step_time"][s] for s in kept)
        out["generated_tokens"] = tokens
        out["tokens_per_s"] = tokens / seconds
    eager = scalars.get("perf/compile_warmup_pending", {})
    if eager:
        loaded = scalars.get("perf/compile_time", {})
        compiled = [s for s in kept if s not in eager and s not in loaded]
        out["steps_eager"] = sorted(eager)
        out["steps_compiled"] = compiled
        if lengths and compiled:
            tokens = sum(rollout_batch_size * n * lengths[s] for s in compiled if s in lengths)
            out["tokens_per_s_compiled"] = tokens / sum(scalars["perf/step_time"][s] for s in compiled)
    return out


def main(argv: list[str] | None = None) -> dict:
    """Reads the run's events and emits the summary line."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("run_dir", type=pathlib.Path, help="the run's --output-dir (events in <dir>/tensorboard)")
    p.add_argument("--rollout-batch-size", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--skip-first", type=int, default=1)
    p.add_argument("--label", default="")
    p.add_argument("--extra-flags", default="", help="the run's extra app flags, recorded in the line")
    a = p.parse_args(argv)
    tb = a.run_dir / "tensorboard" if (a.run_dir / "tensorboard").is_dir() else a.run_dir
    summary = summarize(read_scalars(tb), rollout_batch_size=a.rollout_batch_size, n=a.n, skip_first=a.skip_first)
    fields = {"label": a.label, "rollout_batch_size": a.rollout_batch_size, "n": a.n, "extra_flags": a.extra_flags}
    return _common.emit("e2e", {**fields, **summary})


if __name__ == "__main__":
    main()
