"""Goodput of a run: how much of the generated work was trained on, and where the device time went.

`GoodputMeter.update` is fed each rollout's metrics by the loop and returns the `goodput/*` metrics (per
rollout and cumulative, `goodput/cum/*`) that go to TensorBoard / W&B; `summary` is the one-screen report at
the end of the run. Its sources:

* tokens: `goodput/tokens_*` from the rollout (`slime_rollout.runtime.goodput`: generated, filtered, aborted, surplus,
  unscheduled, truncated) and from the trainer (`slime_core.goodput`: trained = non-zero advantage and loss
  mask, zero advantage);
* time (wall seconds of the driver): `perf/rollout_wait_time` (waiting for samples: all of the generation in
  the sync schedule, what training did not hide in `--async`), `perf/log_probs_time` +
  `perf/ref_log_probs_time` (+ OPD's `perf/teacher_log_probs_time`), `perf/actor_train_time` (+ PPO's
  `perf/critic_train_time`), `perf/update_weights_time`, `perf/weight_check_time`, the colocated memory swaps,
  `perf/save_time`, `perf/eval_time`; `other` is the rest of `perf/step_time`
  (driver and Ray overhead, advantage computation, idle).

Device time: colocated, every device takes part in every phase, so the training share of device time is the
training share of wall time. Disaggregated, the trainer's devices train and the engines' devices generate:
training device-seconds are `(log-probs + train) × trainer devices` out of `wall × (trainer + engine devices)`.
"Training" counts the trainer's forward/backward passes (old/ref log-probs and the optimizer steps).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from slime_core.config import SlimeArgs

__all__ = ["PHASES", "GoodputMeter"]

# Phase -> the perf/* metrics (wall seconds) it sums. Listed in step order; "other" is computed.
PHASES: dict[str, tuple[str, ...]] = {
    "rollout": ("perf/rollout_wait_time",),
    "log_probs": ("perf/log_probs_time", "perf/ref_log_probs_time", "perf/teacher_log_probs_time"),
    "train": ("perf/actor_train_time", "perf/critic_train_time"),  # + PPO's critic step (with its swaps)
    "weight_sync": ("perf/update_weights_time",),
    "weight_check": ("perf/weight_check_time",),
    "swap": (
        "perf/engine_release_time",
        "perf/wake_up_time",
        "perf/sleep_time",
        "perf/engine_resume_weights_time",
        "perf/engine_resume_kv_cache_time",
    ),
    "save": ("perf/save_time",),
}
# Token buckets summed over the run (the rollout's and the trainer's counts).
TOKEN_KEYS = (
    "generated",
    "trained",
    "zero_advantage",
    "filtered",
    "aborted",
    "surplus",
    "unscheduled",
    "offpolicy_masked",
    "truncated",
    "requeued",
)


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 else 0.0


class GoodputMeter:
    """Accumulates the goodput of a run, rollout by rollout.

    Args:
        cfg: the run config: `colocate`, `actor_num_nodes` × `actor_num_gpus_per_node` (trainer devices),
            `rollout_num_gpus` (engine devices; on CPU, one device per trainer rank and per engine; none with
            `debug_train_only` or `load_debug_rollout_data`, which start no engine).
    """

    def __init__(self, cfg: SlimeArgs):
        self.colocate = cfg.colocate
        self.trainer_devices = cfg.actor_num_nodes * cfg.actor_num_gpus_per_node
        # No engine starts with --debug-train-only (the SFT recipe) or --load-debug-rollout-data: counting one halved
        # the training share of a disaggregated run's device time.
        no_engines = cfg.debug_train_only or cfg.load_debug_rollout_data is not None
        self.engine_devices = 0 if no_engines else max(cfg.rollout_num_gpus or 0, 1)
        if self.colocate:
            self.total_devices = max(self.trainer_devices, self.engine_devices)
        else:
            self.total_devices = self.trainer_devices + self.engine_devices
        # SFT (`--loss-type sft_loss`) trains on the dataset's conversations: nothing is generated and no advantage
        # is read, so the summary names its tokens as what they are.
        self.sft = cfg.loss_type == "sft_loss"
        self.reads_advantages = not (self.sft or cfg.disable_compute_advantages_and_returns)
        self.tokens = dict.fromkeys(TOKEN_KEYS, 0.0)
        self.time = dict.fromkeys([*PHASES, "eval", "other"], 0.0)
        self.generation_time = 0.0  # engine busy wall (perf/rollout_time), overlapping training with --async
        self.reward_time = 0.0
        self.num_rollouts = 0

    def _train_device_seconds(self, train_wall: float) -> float:
        devices = self.total_devices if self.colocate else self.trainer_devices
        return train_wall * devices

    def add_eval(self, seconds: float | None) -> None:
        """Counts an evaluation's wall seconds (it runs between steps, outside `perf/step_time`)."""
        self.time["eval"] += float(seconds or 0.0)

    def update(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Accounts one rollout; returns its `goodput/*` metrics (per rollout and `goodput/cum/*`).

        Args:
            metrics: the rollout's metrics (`goodput/tokens_*`, `perf/*`), as the loop logs them.

        Returns:
            `goodput/time/<phase>` (seconds), `goodput/trained_fraction` (trained / generated tokens),
            `goodput/train_device_share` (training share of this rollout's device time), and the cumulative
            `goodput/cum/tokens_<bucket>`, `goodput/cum/trained_fraction`, `goodput/cum/train_device_share`,
            `goodput/cum/trained_tokens_per_device_hour`, `goodput/cum/wall_time`.
        """
        self.num_rollouts += 1
        out: dict[str, float] = {}
        for key in TOKEN_KEYS:
            self.tokens[key] += float(metrics.get(f"goodput/tokens_{key}", 0.0))
        phases = {name: sum(float(metrics.get(k, 0.0)) for k in keys) for name, keys in PHASES.items()}
        step = float(metrics.get("perf/step_time", sum(phases.values())))
        phases["other"] = max(step - sum(phases.values()), 0.0)
        for name, seconds in phases.items():
            self.time[name] += seconds
            out[f"goodput/time/{name}"] = seconds
        self.generation_time += float(metrics.get("perf/rollout_time", 0.0))
        self.reward_time += float(metrics.get("perf/reward_time", 0.0))
        generated = float(metrics.get("goodput/tokens_generated", 0.0))
        out["goodput/trained_fraction"] = _share(float(metrics.get("goodput/tokens_trained", 0.0)), generated)
        train_wall = phases["log_probs"] + phases["train"]
        out["goodput/train_device_share"] = _share(self._train_device_seconds(train_wall), step * self.total_devices)
        out.update(self.cumulative())
        return out

    @property
    def wall_time(self) -> float:
        """Seconds accounted so far: the steps and the evaluations."""
        return sum(self.time.values())

    def cumulative(self) -> dict[str, float]:
        """The `goodput/cum/*` metrics of the rollouts accounted so far."""
        out = {f"goodput/cum/tokens_{key}": value for key, value in self.tokens.items()}
        wall = self.wall_time
        trained = self.tokens["trained"]
        out["goodput/cum/trained_fraction"] = _share(trained, self.tokens["generated"])
        train_wall = self.time["log_probs"] + self.time["train"]
        out["goodput/cum/train_device_share"] = _share(
            self._train_device_seconds(train_wall), wall * self.total_devices
        )
        out["goodput/cum/trained_tokens_per_device_hour"] = _share(trained, wall * self.total_devices / 3600.0)
        out["goodput/cum/wall_time"] = wall
        return out

    def summary(self) -> str:
        """The end-of-run report, one screen of plain text."""
        cum = self.cumulative()
        generated = self.tokens["generated"]
        wall = self.wall_time
        layout = "colocated" if self.colocate else "disaggregated"
        source = "dataset response" if self.sft else "generated"
        lines = [
            f"goodput over {self.num_rollouts} rollouts: {wall:.1f} s accounted, {self.trainer_devices} trainer + "
            f"{self.engine_devices} engine device(s), {layout}",
            f"  {cum['goodput/cum/trained_fraction']:.1%} of {source} tokens trained on, "
            f"{cum['goodput/cum/train_device_share']:.1%} of device time in training",
            f"  tokens {'of the dataset responses' if self.sft else 'generated'} {generated:,.0f}:",
        ]
        labels = {
            "trained": "trained on (non-zero advantage)" if self.reads_advantages else "trained on (loss mask 1)",
            "zero_advantage": "zero advantage (no gradient)",
            "filtered": "dropped by the dynamic filter",
            "aborted": "aborted",
            "surplus": "surplus (batch already full)",
            "unscheduled": "in no optimizer step / removed",
        }
        if not self.reads_advantages:  # no loss term reads an advantage: a zero one leaves nothing untrained
            del labels["zero_advantage"]
        if self.tokens["offpolicy_masked"]:  # only with --partial-rollout --mask-offpolicy-in-partial-rollout
            labels["offpolicy_masked"] = "earlier policies' part, masked"
        for key, label in labels.items():
            lines.append(f"    {label:<34} {self.tokens[key]:>12,.0f}  {_share(self.tokens[key], generated):6.1%}")
        lines.append(
            f"    {'of which truncated (at the limit)':<34} {self.tokens['truncated']:>12,.0f}  "
            f"{_share(self.tokens['truncated'], generated):6.1%}"
        )
        if self.tokens["requeued"]:
            lines.append(f"    partial, carried to later rollouts {self.tokens['requeued']:>11,.0f}")
        lines.append("  wall time by phase:")
        for name, seconds in self.time.items():
            lines.append(f"    {name:<34} {seconds:>10.1f} s  {_share(seconds, wall):6.1%}")
        lines.append(
            f"  engines generating {self.generation_time:.1f} s (reward calls {self.reward_time:.1f} s, summed over "
            "concurrent requests)"
        )
        lines.append(f"  trained tokens per device-hour: {cum['goodput/cum/trained_tokens_per_device_hour']:,.0f}")
        return "\n".join(lines)

    def state(self) -> dict[str, Any]:
        """The totals a checkpoint keeps (`slime_app.run_state`), so that a resumed run's `goodput/cum/*` go on."""
        return {"num_rollouts": self.num_rollouts, "tokens": dict(self.tokens), "time": dict(self.time),
                "generation_time": self.generation_time, "reward_time": self.reward_time}  # fmt: skip

    def restore(self, state: Mapping[str, Any]) -> None:
        """Continues from `state()` of a checkpoint (buckets or phases it lacks stay at zero).

        Raises:
            KeyError, TypeError, ValueError: `state` is not what `state()` returns.
        """
        # Everything is read before anything is set: a bad state leaves the meter as it was.
        tokens = {k: float(dict(state["tokens"]).get(k, 0.0)) for k in self.tokens}
        seconds = {k: float(dict(state["time"]).get(k, 0.0)) for k in self.time}
        num_rollouts, generation = int(state["num_rollouts"]), float(state["generation_time"])
        reward = float(state["reward_time"])
        self.tokens, self.time, self.num_rollouts = tokens, seconds, num_rollouts
        self.generation_time, self.reward_time = generation, reward

    def save(self, path: str) -> str:
        """Writes the cumulative metrics and the phase seconds as JSON; returns `path`."""
        data = {"num_rollouts": self.num_rollouts, **self.cumulative(), "time": self.time}
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(data, f, indent=2)
        os.replace(tmp, path)
        return path
