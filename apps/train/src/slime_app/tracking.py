"""Metrics sink for the driver.

TensorBoard (default) and W&B (`--use-wandb`), one compact line per rollout under the run's progress display
(`slime_app.progress`), and the reward/accuracy curve PNG at the end.
"""

from __future__ import annotations

import glob
import logging
import math
import netrc
import os
import re
import threading
import time
import urllib.parse
import uuid
from collections import defaultdict
from collections.abc import Mapping
from typing import Any

from rich.markup import escape

from slime_app.guards import RunStopped, StartRefused
from slime_app.progress import RunProgress
from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

# How long the end of a run waits for W&B's last uploads (`finish_wandb`).
WANDB_FINISH_TIMEOUT_S = 120.0

# The train series of the curve PNG (beside the eval scores): the only other key `Tracker.history` keeps.
CURVE_KEY = "rollout/raw_reward"

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
    ("train/opd_reverse_kl", "opd_kl"),
    ("train/critic-value_loss", "vloss"),
    ("train/critic-explained_variance", "ev"),
    ("goodput/trained_fraction", "trained"),
    ("perf/step_time", "step_s"),
]


# The user functions whose returned metrics reach the tracker.
_METRIC_HOOKS = (
    "rollout_function_path",
    "eval_function_path",
    "custom_rollout_log_function_path",
    "custom_eval_rollout_log_function_path",
)

_BUILT_IN = ("slime_rollout.", "slime.rollout.")  # the default rollout functions (theirs are numbers)

# What the eval writes beside a dataset's score `eval/<name>` (`slime_rollout.generation.eval`): its truncated and
# aborted shares and, with `--log-passrate`, its pass@k.
_EVAL_DERIVED = re.compile(r"-(truncated_ratio|aborted_ratio|pass@\d+)$")


def is_eval_score(key: str) -> bool:
    """Whether `key` is an eval dataset's score, `eval/<name>` (its mean reward), not a statistic logged beside it.

    Not `eval/<name>-truncated_ratio`, `-aborted_ratio`, `-pass@<k>` nor `eval/<name>/...`; the curve PNG, the
    closing summary and the instability monitor's eval rule take only the scores.
    """
    return key.startswith("eval/") and key.count("/") == 1 and not _EVAL_DERIVED.search(key)


def tensorboard_log_dir(cfg: SlimeArgs, output_dir: str) -> str:
    """TensorBoard directory: `--tensorboard-dir`, `$TENSORBOARD_DIR`, `--tb-project-name`, or the default.

    The first that is set wins; the default is `<output_dir>/tensorboard`. `TENSORBOARD_DIR` is used as given, as
    the original's `_TensorboardAdapter` does (there it wins over the project and experiment names). A relative
    `--tb-project-name` is taken under `output_dir` (not the current directory). With `--tb-experiment-name NAME`
    the run writes to the subdirectory NAME of it.
    """
    if not cfg.tensorboard_dir and os.environ.get("TENSORBOARD_DIR"):
        return os.environ["TENSORBOARD_DIR"]
    # An absolute --tb-project-name stays as given: os.path.join drops output_dir.
    base = cfg.tensorboard_dir or os.path.join(output_dir, cfg.tb_project_name or "tensorboard")
    experiment = cfg.tb_experiment_name
    return os.path.join(base, experiment) if experiment else base


def wandb_init_kwargs(cfg: SlimeArgs, *, suffix: str) -> dict[str, Any]:
    """Keyword arguments of `wandb.init` from the `--wandb-*` flags (the original's naming).

    The run's group and name are `--wandb-group` with `_<suffix>` appended unless `--disable-wandb-random-suffix`;
    `--wandb-run-id` resumes that run (`resume="allow"`).

    Args:
        cfg: the run config: the `--wandb-*` flags, and `to_public_dict()` (credentials redacted) as the logged
            config.
        suffix: the random suffix.
    """
    group = cfg.wandb_group
    if group and not cfg.disable_wandb_random_suffix:
        group = f"{group}_{suffix}"
    kwargs: dict[str, Any] = {
        "entity": cfg.wandb_team,
        "project": cfg.wandb_project,
        "group": group,
        "name": group,
        "config": cfg.to_public_dict(),
    }
    if cfg.wandb_mode:
        kwargs["mode"] = cfg.wandb_mode
    if cfg.wandb_dir:
        kwargs["dir"] = cfg.wandb_dir
    if cfg.wandb_run_id:
        kwargs["id"] = cfg.wandb_run_id
        kwargs["resume"] = "allow"
    return kwargs


def wandb_login_kwargs(cfg: SlimeArgs) -> dict[str, Any] | None:
    """Keyword arguments of `wandb.login` (`--wandb-key`, `--wandb-host`), or None: no login needed or possible.

    As in the original, an offline or disabled run never logs in.
    """
    mode = cfg.wandb_mode or os.environ.get("WANDB_MODE")
    if mode in ("offline", "disabled") or not (cfg.wandb_key or cfg.wandb_host):
        return None
    return {"key": cfg.wandb_key, "host": cfg.wandb_host}


_DEFAULT_WANDB_HOST = "https://api.wandb.ai"


def wandb_key_source(cfg: SlimeArgs) -> str | None:
    """Where an online W&B run gets its API key, or None when it has none and W&B would prompt for one.

    wandb.login / wandb.init without a key wait on an interactive prompt on a terminal (a launch script in tmux
    hung there) and fail without one. The key comes from `--wandb-key`, the `WANDB_API_KEY` variable, or the netrc
    entry `wandb login` writes for the host (`--wandb-host`, else `WANDB_BASE_URL`, else W&B's cloud).
    """
    if cfg.wandb_key:
        return "--wandb-key"
    if os.environ.get("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    host = cfg.wandb_host or os.environ.get("WANDB_BASE_URL") or _DEFAULT_WANDB_HOST
    machine = urllib.parse.urlsplit(host if "//" in host else f"//{host}").hostname or host
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        entry = netrc.netrc(path).authenticators(machine)
    except (OSError, netrc.NetrcParseError):
        return None
    return f"{path} ({machine})" if entry and entry[2] else None


def _claim_folder(parent: str, stem: str) -> str:
    """Creates and returns `<parent>/<stem>`, or `<stem>_2`, `<stem>_3`, ... when another run took that name.

    The folder is made here (`os.mkdir`, which fails for the second of two processes) so that two runs that pick the
    same stem (eval-only runs started in the same second) never share one folder: they shared one when it was named
    by the second alone, and TensorBoard then mixed their events into one run. The names still sort by start time.

    Raises:
        OSError: `parent` cannot be written.
    """
    for n in range(1, 10_000):
        path = os.path.join(parent, stem if n == 1 else f"{stem}_{n}")
        try:
            os.mkdir(path)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"{parent}: {stem} and its numbered variants up to _9999 all exist")


class Tracker:
    """Collects metrics per rollout step and writes them to TensorBoard / W&B.

    Args:
        cfg: run config (`use_tensorboard`, `tensorboard_dir`, `tb_project_name`, `tb_experiment_name`, `use_wandb`
            and the fields of `wandb_init_kwargs` / `wandb_login_kwargs`, `wandb_always_use_train_step` with
            `num_steps_per_rollout`).
        output_dir: where the TensorBoard logs and the curve PNG go when not configured.
        progress: the run's progress display (default: a new one on stdout).

    Attributes:
        tensorboard_dir: where TensorBoard events go; None without `--use-tensorboard`.
        history: the points of the series the curve PNG draws and a checkpoint keeps (`CURVE_KEY` and the eval
            scores, `is_eval_score`), as `(rollout_id, value)` in logging order; the other metrics go to the sinks
            only.

    Raises:
        ValueError: `--use-wandb` without the `wandb` package.
        StartRefused: an online run without an API key (`wandb_key_source`: W&B would prompt for one), or W&B
            refused the login or did not start the run (`_start_wandb`).
    """

    def __init__(self, cfg: SlimeArgs, output_dir: str, progress: RunProgress | None = None):
        self.cfg = cfg
        self.output_dir = output_dir
        self.history: dict[str, list[tuple[int, float]]] = defaultdict(list)
        self.progress = progress or RunProgress()
        self.console = self.progress.console
        self.tensorboard_dir: str | None = None
        self._nonfinite: set[str] = set()  # keys whose last value was NaN or infinite (warned when they became so)
        self._tb = None  # the SummaryWriter, opened at the first point (`_tensorboard`)
        self._tb_purge_step: int | None = None
        self._wandb = None
        if cfg.use_tensorboard:
            self.tensorboard_dir = tensorboard_log_dir(cfg, output_dir)
        if cfg.use_wandb:
            try:
                import wandb
            except ImportError:
                raise ValueError("--use-wandb: the `wandb` package is not installed (pip install wandb)") from None
            mode = cfg.wandb_mode or os.environ.get("WANDB_MODE")
            if mode not in ("offline", "disabled", "dryrun") and wandb_key_source(cfg) is None:
                host = cfg.wandb_host or os.environ.get("WANDB_BASE_URL") or _DEFAULT_WANDB_HOST
                raise StartRefused(
                    f"--use-wandb: no W&B API key for {host} (W&B would wait on an interactive prompt for one): give "
                    "--wandb-key (or WANDB_API_KEY, or run `wandb login"
                    f"{' --host ' + cfg.wandb_host if cfg.wandb_host else ''}` once), or --wandb-mode offline"
                )
            login = wandb_login_kwargs(cfg)
            init = wandb_init_kwargs(cfg, suffix=uuid.uuid4().hex[:8])
            if "dir" in init:
                os.makedirs(init["dir"], exist_ok=True)  # wandb does not create it
            self._wandb = _start_wandb(wandb, login, init)
            # Every metric against one x-axis (see `x_step`), not W&B's own call counter. The original's other
            # axes, `train/step` and `eval/step`, are logged beside it (`log`), so its saved panels still plot.
            self._wandb.define_metric("rollout/step")
            self._wandb.define_metric("train/step")
            self._wandb.define_metric("eval/step")
            self._wandb.define_metric("*", step_metric="rollout/step")

    def start(self, start_rollout_id: int, num_rollout: int) -> None:
        """Sets the rollout bar (`start_rollout_id` of `num_rollout` done) and shows the display."""
        self.progress.set_rollouts(start_rollout_id, num_rollout)
        self.progress.start()

    def begin_at(self, rollout_id: int) -> None:
        """Hides, in TensorBoard, what earlier runs wrote into this run's folder at or after rollout `rollout_id`.

        A run resumed at `rollout_id` (`--load`, `--start-rollout-id`) in the folder of the run it continues logs
        again the rollouts that run did after its checkpoint, and a new run in the same `--output-dir` logs every
        rollout again: every key had two points at those steps (the original writes each run into a new
        timestamped folder unless `TENSORBOARD_DIR` is set). SummaryWriter's `purge_step` (a `SessionLog.START` at that
        step, which TensorBoard reads as a restart) hides the earlier points from `x_step(rollout_id)` on; the files
        stay. Call before the first `log`. W&B has no such mark (a resumed `--wandb-run-id` keeps both points).
        """
        if self.tensorboard_dir is None:
            return
        if rollout_id == 0:
            if not glob.glob(os.path.join(glob.escape(self.tensorboard_dir), "events.out.tfevents.*")):
                return
            logger.info(
                "TensorBoard: %s holds an earlier run's events; this run starts at rollout 0, so TensorBoard shows "
                "its points only (another --tensorboard-dir or --tb-experiment-name keeps both)", self.tensorboard_dir
            )  # fmt: skip
        self._tb_purge_step = self.x_step(rollout_id)

    def begin_eval_only(self) -> None:
        """Puts an eval-only run's (`--num-rollout 0`) TensorBoard events beside an earlier run's, not into its series.

        Its one eval is logged at rollout 0: in a folder holding a training run's events TensorBoard showed a second
        `eval/*` point at step 0 of that run (and a purge from step 0, as `begin_at(0)` does for a new training run,
        would hide the whole earlier run). The original writes every run into a new timestamped folder unless
        `TENSORBOARD_DIR` is set; so here the eval goes to the subfolder `eval_only_<YYYYmmdd_HHMMSS>`, which
        TensorBoard lists as its own run (`_claim_folder`: `..._2`, `..._3` for runs started in the same second).
        An empty folder is used as it is. Call before the first `log`.
        """
        if self.tensorboard_dir is None:
            return
        if not glob.glob(os.path.join(glob.escape(self.tensorboard_dir), "events.out.tfevents.*")):
            return
        own = _claim_folder(self.tensorboard_dir, "eval_only_" + time.strftime("%Y%m%d_%H%M%S"))
        logger.info(
            "TensorBoard: %s holds an earlier run's events; this eval-only run writes to %s (its own run there)",
            self.tensorboard_dir, own,
        )  # fmt: skip
        self.tensorboard_dir = own

    def _tensorboard(self):
        """The run's SummaryWriter (opened at the first call, with `begin_at`'s purge step); None without one."""
        if self._tb is None and self.tensorboard_dir is not None:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(self.tensorboard_dir, purge_step=self._tb_purge_step)
        return self._tb

    def x_step(self, rollout_id: int) -> int:
        """The x-axis value of rollout `rollout_id` in TensorBoard and W&B.

        The rollout id, or with `--wandb-always-use-train-step` the optimizer steps done before it:
        `rollout_id * num_steps_per_rollout` (the original's `rollout_id * rollout_batch_size *
        n_samples_per_prompt // global_batch_size`; config validation makes the division exact).
        """
        if not self.cfg.wandb_always_use_train_step:
            return rollout_id
        return rollout_id * self.cfg.num_steps_per_rollout

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Records metrics for rollout `step` (keys like `rollout/raw_reward`, `eval/demo`).

        NaN and infinite values are written as they are (as the original does), with one warning naming the keys
        when they become non-finite (again once they were finite in between): a NaN loss or grad norm, a log-prob
        average over an empty mask, showed only as a gap in a dashboard.

        Raises:
            RunStopped: a value that is not a number (what a rollout function or a custom log function returned),
                before any point of `metrics` is written: one line naming the key, not `float()`'s traceback.
        """
        x = self.x_step(step)
        values = {key: self._number(step, key, value) for key, value in metrics.items() if value is not None}
        tb = self._tensorboard()
        for key, value in values.items():
            # Only the curve's series: every metric of every rollout stayed in memory for the whole run (7 kB a
            # rollout at 90 keys: 70 MB over 10k rollouts) with no reader.
            if key == CURVE_KEY or is_eval_score(key):
                self.history[key].append((step, value))
            if tb is not None:
                tb.add_scalar(key, value, x)
        self._warn_nonfinite(step, values)
        if self._wandb is not None:
            self._wandb.log({**values, **self._wandb_steps(step, values), "rollout/step": x})

    def _number(self, step: int, key: str, value: Any) -> float:
        """`float(value)` (a number, a bool, a one-element array or tensor), or RunStopped naming `key`."""
        try:
            return float(value)
        except (TypeError, ValueError):
            hooks = [
                f"--{name.replace('_', '-')} {path}"
                for name in _METRIC_HOOKS
                if (path := getattr(self.cfg, name)) and not path.startswith(_BUILT_IN)
            ]
            source = f" (from {' or '.join(hooks)}?)" if hooks else ""
            raise RunStopped(
                f"metric {key!r} at rollout {step} is {type(value).__name__} {repr(value)[:80]}, not a "
                f"number{source}: TensorBoard and W&B take numbers only"
            ) from None

    def _warn_nonfinite(self, step: int, metrics: dict[str, float]) -> None:
        nonfinite = {k: v for k, v in metrics.items() if not math.isfinite(v)}
        self._nonfinite -= {k for k in metrics if k not in nonfinite}
        new = sorted(k for k in nonfinite if k not in self._nonfinite)
        if new:
            logger.warning(
                "rollout %d: non-finite metrics: %s", step, ", ".join(f"{k}={nonfinite[k]}" for k in new)
            )  # fmt: skip
        self._nonfinite |= set(nonfinite)

    def _wandb_steps(self, rollout_id: int, metrics: dict[str, float]) -> dict[str, int]:
        """The original's W&B x-axes besides `rollout/step`, for the keys present.

        `train/step`: the optimizer steps before this rollout's first, `rollout_id * num_steps_per_rollout` (the
        `train/*` values are the rollout's mean over its steps); `eval/step`: the rollout axis.
        """
        steps = {}
        if any(key.startswith("train/") for key in metrics):
            steps["train/step"] = rollout_id * self.cfg.num_steps_per_rollout
        if any(key.startswith("eval/") for key in metrics):
            steps["eval/step"] = self.x_step(rollout_id)
        return steps

    def rollout_done(self, step: int, metrics: dict[str, float]) -> None:
        """Prints the compact line for one rollout and advances the bar."""
        parts = [f"{label}={metrics[key]:.4g}" for key, label in _COMPACT if key in metrics]
        self.console.print(f"[dim]rollout {step:>4}[/dim] " + escape(" ".join(parts)))
        self.progress.advance()

    def eval_line(self, step: int, metrics: dict[str, float]) -> None:
        """Prints eval results."""
        parts = [f"{k}={v:.4g}" for k, v in metrics.items() if "/" in k and k.count("/") == 1]
        # Dataset names are the user's: escaped so that brackets in them print verbatim, not as markup.
        self.console.print(f"[bold cyan]eval @ rollout {step}[/bold cyan] " + escape(" ".join(parts)))

    def eval_series(self, key_prefix: str = "eval/") -> dict[str, list[tuple[int, float]]]:
        """The recorded eval scores, one curve per dataset (`is_eval_score`)."""
        return {k: v for k, v in self.history.items() if k.startswith(key_prefix) and is_eval_score(k)}

    def state(self) -> dict[str, Any]:
        """The series the curve PNG draws (`rollout/raw_reward`, `eval_series`), for a checkpoint.

        Kept by `slime_app.run_state`: a resumed run drew (over the earlier PNG, in the same `--output-dir`) only the
        rollouts since its start.
        """
        keys = [CURVE_KEY, *self.eval_series()]
        return {"curves": {key: [list(point) for point in self.history[key]] for key in keys if self.history.get(key)}}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Puts the saved curve points before this run's (`state()`).

        Raises:
            KeyError, TypeError, ValueError: `state` is not what `state()` returns.
        """
        curves = {key: [(int(step), float(value)) for step, value in points]
                  for key, points in dict(state["curves"]).items()}  # fmt: skip
        for key, points in curves.items():
            self.history[key] = points + self.history.get(key, [])

    def save_curve(self, path: str) -> str:
        """Writes a PNG of the rollout reward and eval accuracy over rollouts; returns its path."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        fig, ax = plt.subplots(figsize=(7, 4))
        for key in (CURVE_KEY,):
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
        """Stops the display and flushes the writers."""
        self.progress.stop()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            finish_wandb(self._wandb)


def _start_wandb(wandb: Any, login: dict[str, Any] | None, init: dict[str, Any]) -> Any:
    """`wandb.login(**login)` (when not None), then the run of `wandb.init(**init)`.

    Raises:
        StartRefused: W&B refused the key or host, or could not start the run (no network within its init timeout,
            an unknown entity or project): one line naming the flags, before Ray or any engine starts. A traceback
            before.
    """
    try:
        if login is not None:
            wandb.login(**login)
    except Exception as e:  # wandb's own errors have no common base with requests' and ValueError
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        flags = f"--wandb-key, --wandb-host {login['host']}"
        raise StartRefused(f"--use-wandb: W&B login failed ({flags}): {reason}") from e
    try:
        return wandb.init(**init)
    except Exception as e:
        reason = " ".join(f"{type(e).__name__}: {e}".split())
        raise StartRefused(
            f"--use-wandb: W&B could not start the run (--wandb-team {init['entity']}, --wandb-project "
            f"{init['project']}): {reason}; --wandb-mode offline keeps it on disk (`wandb sync` uploads it later)"
        ) from e


def finish_wandb(run: Any, timeout_s: float | None = None) -> bool:
    """`run.finish()`, given at most `timeout_s` (default `WANDB_FINISH_TIMEOUT_S`); False when it did not return.

    W&B's finish waits for every upload, with no deadline of its own: after the network went away it has run
    for hours (wandb/wandb#11179, #6803), and the run, its training done, never ended. Past the deadline the
    finish is left to its daemon thread and a warning says where the run's files are (`wandb sync` uploads them).
    """
    timeout_s = WANDB_FINISH_TIMEOUT_S if timeout_s is None else timeout_s
    thread = threading.Thread(target=run.finish, name="wandb finish", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if not thread.is_alive():
        return True
    logger.warning(
        "W&B did not finish its uploads within %.0f s (no network?); the run's files are in %s: "
        "`wandb sync` uploads them later", timeout_s, getattr(run, "dir", None) or "the --wandb-dir folder",
    )  # fmt: skip
    return False
