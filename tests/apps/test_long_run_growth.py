"""The driver's per-rollout state stays bounded over a long run (issue 27, pass 90).

A real RL run goes for thousands of rollouts; a 2-rollout end-to-end test never sees what one keeps per rollout.
Each test feeds a driver component a few thousand rollouts' worth of input and checks both what it keeps (entry
counts) and the Python memory it grew by over the second half (tracemalloc), against a bound a per-rollout leak of
the metrics breaks by an order of magnitude.
"""

import io
import tracemalloc

from rich.console import Console

from slime_app.instability import InstabilityMonitor
from slime_app.progress import EVENTS_KEPT, PhaseEvent, RunProgress
from slime_app.tracking import Tracker
from slime_core.config import SlimeArgs, parse_args

NUM_KEYS = 90  # about what a demo rollout logs (rollout/*, train/*, perf/*, goodput/*)
EVAL_EVERY = 10


def _metrics(r: int) -> dict[str, float]:
    """One rollout's metrics: NUM_KEYS keys, the ones the rules and the curve read among them."""
    wobble = 1.0 + 0.05 * ((r % 3) - 1)
    out = {f"perf/stat_{i}": float(r % 7 + i) for i in range(NUM_KEYS - 6)}
    out |= {
        "train/entropy_loss": 1.2 * wobble,
        "train/ppo_kl": 2e-3 * wobble,
        "train/grad_norm": 0.8 * wobble,
        "rollout/response_len/mean": 40.0 * wobble,
        "rollout/truncated_ratio": 0.05,
        "rollout/raw_reward": 0.3 + 1e-4 * r,
    }
    return out


def _grown_bytes(feed, first: int, total: int) -> int:
    """Feeds rollouts 0..first-1, then the Python memory `feed` keeps for rollouts first..total-1 (bytes)."""
    feed(0, first)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        feed(first, total)
        return tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()


def test_the_tracker_keeps_only_the_curve_series(tmp_path):
    # Tracker.history kept every metric of every rollout for the whole run (7 kB a rollout here: 14 MB over these
    # 2,000 rollouts), though only the curve PNG and the checkpoint's run state read it, and only the train
    # reward and the eval scores.
    args = parse_args(
        ["--train-backend", "fsdp", "--hf-checkpoint", "/models/m", "--prompt-data", "/data/d.jsonl",
         "--rollout-batch-size", "4", "--n-samples-per-prompt", "2", "--global-batch-size", "2",
         "--num-rollout", "5000", "--rollout-max-response-len", "8", "--no-use-tensorboard"]
    )  # fmt: skip
    tracker = Tracker(args, str(tmp_path), RunProgress(Console(file=io.StringIO(), force_terminal=False)))

    def feed(start: int, stop: int) -> None:
        for r in range(start, stop):
            tracker.log(r, _metrics(r))
            if r % EVAL_EVERY == EVAL_EVERY - 1:
                tracker.log(r + 1, {"eval/demo": 0.5, "eval/demo-truncated_ratio": 0.0, "perf/eval_time": 3.0})

    grown = _grown_bytes(feed, 500, 2500)
    tracker.close()
    assert sorted(tracker.history) == ["eval/demo", "rollout/raw_reward"]
    assert len(tracker.history["rollout/raw_reward"]) == 2500 and len(tracker.history["eval/demo"]) == 250
    assert tracker.history["rollout/raw_reward"][-1] == (2499, 0.3 + 1e-4 * 2499)
    # The curve's one point a rollout (and an eval point every 10) is what remains: ~0.1 kB a rollout.
    assert grown < 2000 * 400, grown


def test_the_instability_monitor_keeps_only_what_its_rules_read():
    # InstabilityMonitor.history kept every metric of every rollout too (7 kB a rollout here), and each spike check
    # copied a metric's whole series to read its last --instability-window values.
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 8, "num_rollout": 5000, "rollout_max_response_len": 100})
    monitor = InstabilityMonitor(cfg)

    def feed(start: int, stop: int) -> None:
        for r in range(start, stop):
            assert monitor.observe(r, _metrics(r)) == []
            if r % EVAL_EVERY == EVAL_EVERY - 1:
                assert monitor.observe_eval(r + 1, {"eval/demo": 0.5}) == []

    grown = _grown_bytes(feed, 500, 3000)
    window, warmup = cfg.instability_window, cfg.instability_warmup
    kept = {key: len(points) for key, points in monitor.history.items()}
    # The warm-up of the entropy baseline, a window of each spike metric present, and the rewards since the last
    # three before the last eval (at 3000: rollouts 2997..2999 before it, none after).
    assert kept == {"train/entropy_loss": warmup, "train/ppo_kl": window, "train/grad_norm": window,
                    "rollout/raw_reward": 3}  # fmt: skip
    assert monitor.history["train/entropy_loss"][0][0] == 0  # the baseline is still the run's first rollouts
    assert grown < 2500 * 200, grown
    # The rules still read the right past after thousands of rollouts: a grad-norm spike against the window's
    # median, and a reward rise with an eval fall between two evals.
    spike = monitor.observe(3000, {**_metrics(3000), "train/grad_norm": 50.0})
    assert [f.rule for f in spike] == ["grad_norm_spike"]
    for r in range(3001, 3010):
        monitor.observe(r, {**_metrics(r), "rollout/raw_reward": 0.9})
    hacked = monitor.observe_eval(3010, {"eval/demo": 0.3})
    assert [f.rule for f in hacked] == ["reward_up_eval_down"]


def test_the_progress_display_keeps_the_newest_phase_events():
    # RunProgress.events kept every phase start and end of the run: about 10 a rollout (0.2 kB each).
    progress = RunProgress(Console(file=io.StringIO(), force_terminal=False), live=False, heartbeat_s=3600.0)
    num_steps = 3 * EVENTS_KEPT
    for r in range(num_steps):
        for name in ("rollout", "train"):
            with progress.phase(name, r):
                pass
    assert EVENTS_KEPT <= len(progress.events) <= 2 * EVENTS_KEPT
    newest = progress.events[-4:]
    assert [(e.kind, e.name, e.rollout_id) for e in newest] == [
        ("start", "rollout", num_steps - 1), ("end", "rollout", num_steps - 1),
        ("start", "train", num_steps - 1), ("end", "train", num_steps - 1),
    ]  # fmt: skip
    assert all(isinstance(e, PhaseEvent) for e in progress.events)
