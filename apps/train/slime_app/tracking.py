"""Metrics sink for the driver.

TensorBoard (default) and W&B (`--use-wandb`), a rich progress bar with one compact line per rollout,
and the reward/accuracy curve PNG at the end.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

logger = logging.getLogger(__name__)

# Keys shown in the one-line summary per rollout, with their short labels.
_COMPACT = [
    ("rollout/raw_reward", "reward"),
    ("rollout/response_len/mean", "resp_len"),
    ("rollout/truncated_ratio", "trunc"),
    ("train/loss", "loss"),
    ("train/pg_clipfrac", "clipfrac"),
    ("train/ppo_kl", "ppo_kl"),
    ("train/grad_norm", "gnorm"),
    ("train/train_rollout_logprob_abs_diff", "|Δlogp|"),
    ("perf/step_time", "step_s"),
]


class Tracker:
    """Collects metrics per rollout step and writes them to TensorBoard / W&B.

    Args:
        args: run config (`use_tensorboard`, `tensorboard_dir`, `use_wandb`, `wandb_project`, `wandb_group`,
            `wandb_run_name`).
        output_dir: where the TensorBoard logs and the curve PNG go when not configured.
    """

    def __init__(self, args: Any, output_dir: str):
        self.args = args
        self.output_dir = output_dir
        self.history: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.console = Console(stderr=False, soft_wrap=True)
        self._tb = None
        self._wandb = None
        if getattr(args, "use_tensorboard", False):
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard_dir = args.tensorboard_dir or os.path.join(output_dir, "tensorboard")
            self._tb = SummaryWriter(self.tensorboard_dir)
        if getattr(args, "use_wandb", False):
            try:
                import wandb
            except ImportError:
                raise ValueError("--use-wandb: the `wandb` package is not installed (pip install wandb)") from None
            self._wandb = wandb.init(
                project=args.wandb_project,
                group=getattr(args, "wandb_group", None),
                name=getattr(args, "wandb_run_name", None),
                config=args.to_dict(),
            )
        self.progress = Progress(
            TextColumn("[bold]rollout"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task = None

    def start(self, start_rollout_id: int, num_rollout: int) -> None:
        """Shows the progress bar."""
        self.progress.start()
        self._task = self.progress.add_task("rollout", total=num_rollout, completed=start_rollout_id)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Records metrics for rollout `step` (keys like `rollout/raw_reward`, `eval/demo`)."""
        for key, value in metrics.items():
            if value is None:
                continue
            value = float(value)
            self.history[key].append((step, value))
            if self._tb is not None:
                self._tb.add_scalar(key, value, step)
        if self._wandb is not None:
            self._wandb.log({**metrics, "rollout/step": step})

    def rollout_done(self, step: int, metrics: dict[str, float]) -> None:
        """Prints the compact line for one rollout and advances the bar."""
        parts = [f"{label}={metrics[key]:.4g}" for key, label in _COMPACT if key in metrics]
        self.console.print(f"[dim]rollout {step:>4}[/dim] " + " ".join(parts))
        if self._task is not None:
            self.progress.update(self._task, advance=1)

    def eval_line(self, step: int, metrics: dict[str, float]) -> None:
        """Prints eval results."""
        parts = [f"{k}={v:.4g}" for k, v in metrics.items() if "/" in k and k.count("/") == 1]
        self.console.print(f"[bold cyan]eval @ rollout {step}[/bold cyan] " + " ".join(parts))

    def eval_series(self, key_prefix: str = "eval/") -> dict[str, list[tuple[int, float]]]:
        """The recorded eval curves (one per dataset)."""
        return {
            k: v
            for k, v in self.history.items()
            if k.startswith(key_prefix) and k.count("/") == 1 and not k.endswith("-truncated_ratio")
        }

    def save_curve(self, path: str) -> str:
        """Writes a PNG of the rollout reward and eval accuracy over rollouts; returns its path."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        fig, ax = plt.subplots(figsize=(7, 4))
        for key in ("rollout/raw_reward",):
            if self.history.get(key):
                xs, ys = zip(*self.history[key], strict=True)
                ax.plot(xs, ys, label="train reward (rollout mean)", alpha=0.7)
        for key, series in self.eval_series().items():
            xs, ys = zip(*series, strict=True)
            ax.plot(xs, ys, marker="o", label=f"{key} (mean reward)")
        ax.set_xlabel("rollout")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("reward / accuracy")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        tmp = path + ".tmp.png"
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        os.replace(tmp, path)
        return path

    def close(self) -> None:
        """Stops the bar and flushes the writers."""
        if self._task is not None:
            self.progress.stop()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
