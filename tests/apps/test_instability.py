"""Instability rules on synthetic metric streams: each rule fires where it should, names metric/rollout/threshold,
warns once per episode, and stays quiet on a healthy stream; the loop stops with `--stop-on-instability`."""

import pytest

from slime_app import loop, rollout_schedule
from slime_app.guards import RunStopped, first_step_logprob_gate
from slime_app.instability import InstabilityMonitor
from slime_core.config import SlimeArgs


def _cfg(**fields):
    return SlimeArgs.from_dict({"rollout_batch_size": 8, "num_rollout": 100, "rollout_max_response_len": 100, **fields})


def _healthy(r):
    """A calm rollout: values wobble a little around typical levels."""
    wobble = 1.0 + 0.05 * ((r % 3) - 1)
    return {
        "train/entropy_loss": 1.2 * wobble,
        "train/ppo_kl": 2e-3 * wobble,
        "train/train_rollout_logprob_abs_diff": 5e-3 * wobble,
        "train/grad_norm": 0.8 * wobble,
        "train/pg_clipfrac": 0.02,
        "rollout/response_len/mean": 40.0 * wobble,
        "rollout/truncated_ratio": 0.05,
        "rollout/raw_reward": 0.3 + 0.01 * r,
        "rollout/zero_std/count_0.0": 2.0,
    }


def _stream(monitor, n, **overrides_at):
    """Feeds rollouts 0..n-1; `overrides_at={"r7": {...}}` replaces metrics at rollout 7. Returns all findings."""
    found = []
    for r in range(n):
        metrics = _healthy(r)
        metrics.update(overrides_at.get(f"r{r}", {}))
        found += monitor.observe(r, metrics)
    return found


def test_healthy_stream_is_quiet():
    assert _stream(InstabilityMonitor(_cfg()), 30) == []


@pytest.mark.parametrize(
    ("override", "rule", "metric", "threshold", "flag"),
    [
        ({"train/entropy_loss": 0.1}, "entropy_collapse", "train/entropy_loss", 0.12, "--instability-entropy-collapse"),
        ({"train/entropy_loss": 4.0}, "entropy_blowup", "train/entropy_loss", 3.6, "--instability-entropy-blowup"),
        ({"train/ppo_kl": 0.05}, "kl_spike", "train/ppo_kl", 0.02, "--instability-kl-spike"),
        ({"train/train_rollout_logprob_abs_diff": 0.2}, "kl_spike", "train/train_rollout_logprob_abs_diff", 0.05,
         "--instability-kl-spike"),
        ({"train/grad_norm": 20.0}, "grad_norm_spike", "train/grad_norm", 8.0, "--instability-grad-norm-spike"),
        ({"rollout/response_len/mean": 95.0}, "response_len_limit", "rollout/response_len/mean", 90.0,
         "--instability-response-len-frac"),
        ({"rollout/truncated_ratio": 0.6}, "truncation", "rollout/truncated_ratio", 0.5,
         "--instability-truncated-ratio"),
        ({"rollout/zero_std/count_0.0": 5.0, "rollout/zero_std/count_1.0": 3.0}, "zero_advantage_groups",
         "rollout/zero_std/count_*", 0.9, "--instability-zero-adv-group-frac"),
        ({"train/pg_clipfrac": 0.35}, "clip_fraction", "train/pg_clipfrac", 0.2, "--instability-clipfrac"),
    ],
)  # fmt: skip
def test_each_rule_fires_once_with_metric_rollout_and_threshold(override, rule, metric, threshold, flag):
    # Rollouts 0..11 are healthy (medians: entropy 1.2, ppo_kl 2e-3, logprob diff 5e-3, grad norm 0.8); the
    # condition holds at 12 and 13 (one episode: one warning), clears, and comes back at 20 (a second warning).
    monitor = InstabilityMonitor(_cfg())
    found = _stream(monitor, 22, r12=override, r13=override, r20=override)
    assert [(f.rule, f.metric, f.rollout_id) for f in found] == [(rule, metric, 12), (rule, metric, 20)]
    assert found[0].threshold == pytest.approx(threshold, rel=0.06)  # spike limits use the wobbling medians
    assert "rollout 12" in found[0].message and metric.split("*")[0] in found[0].message and flag in found[0].message
    assert InstabilityMonitor.metrics_of(found[:1]) == {f"instability/{rule}": 1.0}


def test_zero_threshold_turns_a_rule_off():
    monitor = InstabilityMonitor(_cfg(instability_clipfrac=0.0, instability_grad_norm_spike=0.0))
    assert _stream(monitor, 15, r12={"train/pg_clipfrac": 0.9, "train/grad_norm": 100.0}) == []


def test_no_response_length_limit_skips_the_length_rule():
    # The original's SFT recipe (slime.rollout.sft_rollout, --debug-train-only) sets no --rollout-max-response-len.
    monitor = InstabilityMonitor(_cfg(rollout_max_response_len=None))
    found = _stream(monitor, 15, r12={"rollout/response_len/mean": 5000.0, "rollout/truncated_ratio": 0.6})
    assert [f.rule for f in found] == ["truncation"]  # the other rules still run


def test_spike_rules_wait_for_warmup_and_respect_floors():
    # A huge grad norm at rollout 1 has no baseline yet (warm-up 3): no warning.
    assert _stream(InstabilityMonitor(_cfg()), 3, r1={"train/grad_norm": 50.0}) == []
    # A KL going 1e-6 -> 1e-4 is 100x but under the 1e-3 floor: noise, not a jump.
    tiny = {f"r{r}": {"train/ppo_kl": 1e-6} for r in range(12)}
    tiny["r12"] = {"train/ppo_kl": 1e-4}
    assert _stream(InstabilityMonitor(_cfg()), 13, **tiny) == []


def test_reward_up_eval_down_is_reward_hacking():
    monitor = InstabilityMonitor(_cfg())
    for r in range(10):
        monitor.observe(r, {"rollout/raw_reward": 0.2})
    assert monitor.observe_eval(10, {"eval/gsm8k": 0.50, "eval/gsm8k-truncated_ratio": 0.0}) == []
    for r in range(10, 20):
        monitor.observe(r, {"rollout/raw_reward": 0.2 + 0.05 * (r - 9)})  # reward climbs to 0.7
    found = monitor.observe_eval(20, {"eval/gsm8k": 0.40})
    assert [(f.rule, f.metric, f.rollout_id) for f in found] == [("reward_up_eval_down", "eval/gsm8k", 20)]
    assert "0.5 -> 0.4" in found[0].message and "--instability-reward-eval-gap" in found[0].message
    # Eval falls but the reward did not rise: no warning.
    quiet = InstabilityMonitor(_cfg())
    for r in range(20):
        quiet.observe(r, {"rollout/raw_reward": 0.2})
        if r in (9, 19):
            assert quiet.observe_eval(r + 1, {"eval/gsm8k": 0.5 if r == 9 else 0.3}) == []


def test_first_step_gate_stops_above_threshold_and_warns_below(caplog):
    cfg = _cfg()
    with pytest.raises(RunStopped, match=r"0.3 > 0.1 \(--first-step-logprob-diff-threshold\)"):
        first_step_logprob_gate(cfg, {"train/train_rollout_logprob_abs_diff": 0.3})
    first_step_logprob_gate(cfg, {"train/train_rollout_logprob_abs_diff": 0.07})  # warning only
    assert "FIRST-STEP CHECK" in caplog.text
    first_step_logprob_gate(cfg.model_copy(update={"first_step_logprob_diff_threshold": 0.0}),
                            {"train/train_rollout_logprob_abs_diff": 5.0})  # fmt: skip
    first_step_logprob_gate(cfg, {})  # no rollout log-probs: nothing to check


class _Manager:
    def __getattr__(self, name):
        return type("M", (), {"remote": staticmethod(lambda *a: (name, a))})()


def _loop_run(monkeypatch, per_rollout_metrics, **fields):
    """A `Run` with fake Ray whose trainer returns `per_rollout_metrics[rollout_id]`; returns (run, logged)."""
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 8, "num_rollout": len(per_rollout_metrics), **fields})
    logged = {}

    class Trainer:
        def train(self, rollout_id, refs):
            return per_rollout_metrics[rollout_id]

        def update_weights(self, version):
            return {}

    class Tracker:
        def log(self, step, metrics):
            logged.setdefault(step, {}).update(metrics)

        def rollout_done(self, step, metrics):
            pass

    fake_ray = type("R", (), {"get": staticmethod(lambda ref: ([], {}))})()
    for module in (loop, rollout_schedule):  # the loop and its rollout schedule
        monkeypatch.setattr(module, "ray", fake_ray)
    run = loop.Run.__new__(loop.Run)
    run.cfg, run.manager, run.trainer, run.tracker = cfg, _Manager(), Trainer(), Tracker()
    run.start_rollout_id = 0
    run.goodput, run.instability = loop.GoodputMeter(cfg), loop.InstabilityMonitor(cfg)
    run.restorer = loop.EngineRestorer(cfg, run.manager, run.trainer)
    run.rollouts = loop.Rollouts(run.manager, cfg.num_rollout, ahead=False, update_weights_interval=1)
    return run, logged


def test_loop_stops_on_instability_after_logging_the_rollout(monkeypatch):
    metrics = [{"train/pg_clipfrac": 0.01}, {"train/pg_clipfrac": 0.5}, {"train/pg_clipfrac": 0.01}]
    run, logged = _loop_run(monkeypatch, metrics, stop_on_instability=True)
    run.step(0)
    with pytest.raises(RunStopped, match=r"rollout 1: clip_fraction: train/pg_clipfrac = 0.5 > 0.2"):
        run.step(1)
    assert logged[1]["instability/clip_fraction"] == 1.0
    # Without the flag the same stream only warns and the run goes on.
    run, logged = _loop_run(monkeypatch, metrics)
    for r in range(3):
        run.step(r)
    assert "instability/clip_fraction" in logged[1] and "instability/clip_fraction" not in logged[2]


def test_loop_first_step_gate(monkeypatch):
    run, logged = _loop_run(monkeypatch, [{"train/train_rollout_logprob_abs_diff": 0.9}])
    with pytest.raises(RunStopped, match="first-step check failed"):
        run.step(0)
    assert logged[0]["train/train_rollout_logprob_abs_diff"] == 0.9  # logged before the stop


def test_loop_first_step_gate_waits_for_the_actors_first_step_after_critic_only_steps(monkeypatch):
    # PPO's --num-critic-only-steps: rollouts 0 and 1 train only the critic (no log-prob gap to check).
    diffs = [{"train/critic-value_loss": 0.3}, {"train/critic-value_loss": 0.2}, {DIFF: 0.9}]
    run, logged = _loop_run(monkeypatch, diffs, advantage_estimator="ppo", num_critic_only_steps=2)
    run.step(0)
    run.step(1)
    with pytest.raises(RunStopped, match="first-step check failed"):
        run.step(2)
    # Without critic-only steps the gate sits on the first rollout, and a later gap only warns.
    run, _ = _loop_run(monkeypatch, [{DIFF: 0.001}, {DIFF: 0.9}], advantage_estimator="ppo")
    run.step(0)
    run.step(1)


DIFF = "train/train_rollout_logprob_abs_diff"


def test_a_resumed_run_keeps_the_baselines_and_the_evals_its_rules_compare_with():
    """The rules go on from a checkpoint's `state()` (saved as JSON by `slime_app.run_state`) as without the stop.

    A resumed run took its warm-up baseline from its own first rollouts: an entropy collapse under way at the resume
    became the baseline (never reported), and a reward-vs-eval gap spanning the resume had no earlier eval.
    """
    import json

    collapse = {"train/entropy_loss": 0.1}
    rewards = {f"r{r}": {"rollout/raw_reward": 0.2 + 0.05 * max(r - 9, 0)} for r in range(20)}

    def feed(monitor, rollouts):
        found = []
        for r in rollouts:
            metrics = {**_healthy(r), **rewards[f"r{r}"], **(collapse if r >= 10 else {})}
            found += monitor.observe(r, metrics)
            if r == 9:
                found += monitor.observe_eval(10, {"eval/gsm8k": 0.5})
        return found + (monitor.observe_eval(20, {"eval/gsm8k": 0.4}) if 19 in rollouts else [])

    straight = [(f.rule, f.rollout_id) for f in feed(InstabilityMonitor(_cfg()), range(20))]
    assert straight == [("entropy_collapse", 10), ("reward_up_eval_down", 20)]
    for stop in (9, 13):  # before the collapse, and during it (already reported)
        first = InstabilityMonitor(_cfg())
        before = feed(first, range(stop + 1))
        resumed = InstabilityMonitor(_cfg())
        resumed.restore(json.loads(json.dumps(first.state())))
        after = feed(resumed, range(stop + 1, 20))
        assert [(f.rule, f.rollout_id) for f in before + after] == straight, stop


def test_an_aborted_share_that_falls_is_not_an_eval_score_that_fell():
    # `eval/<name>-aborted_ratio` (and `-pass@<k>`) were read as eval scores: fewer aborted samples (0.5 -> 0.1)
    # while the reward rose was reported as reward hacking, and --stop-on-instability stopped the run.
    monitor = InstabilityMonitor(_cfg())
    for r in range(10):
        monitor.observe(r, {"rollout/raw_reward": 0.2})
    first = {"eval/gsm8k": 0.5, "eval/gsm8k-aborted_ratio": 0.5, "eval/gsm8k-pass@4": 0.9}
    assert monitor.observe_eval(10, first) == []
    for r in range(10, 20):
        monitor.observe(r, {"rollout/raw_reward": 0.2 + 0.05 * (r - 9)})
    later = {"eval/gsm8k": 0.5, "eval/gsm8k-aborted_ratio": 0.1, "eval/gsm8k-pass@4": 0.9}
    assert monitor.observe_eval(20, later) == []


@pytest.mark.parametrize(
    ("nan_at", "override", "rule"),
    [
        ("r13", {"train/grad_norm": 20.0}, "grad_norm_spike"),  # the NaN in the middle of the rolling window
        ("r1", {"train/entropy_loss": 0.1}, "entropy_collapse"),  # the NaN inside the warm-up baseline
    ],
)
def test_a_nan_metric_does_not_blind_the_rules_that_follow(nan_at, override, rule):
    # One NaN grad norm / entropy (the tracker warns about it) made statistics.median NaN over the window (here
    # rollouts 12-14) or the warm-up: every later comparison with it was False, so the jump at rollout 15 went
    # unreported (the warm-up's for the rest of the run).
    nan = {"train/grad_norm": float("nan"), "train/entropy_loss": float("nan")}
    monitor = InstabilityMonitor(_cfg(instability_window=3))
    found = _stream(monitor, 16, **{nan_at: nan, "r15": override})
    assert [(f.rule, f.rollout_id) for f in found] == [(rule, 15)]


def test_equal_rewards_in_groups_warn_only_where_they_zero_the_advantage():
    # rollout/zero_std/count_* now counts groups of one sample too (as the original): under REINFORCE++ without a
    # baseline (rewards not normalized per group) a run with --n-samples-per-prompt 1 has every group "zero std"
    # though every advantage is the reward itself; the zero_advantage_groups rule fired on it at once.
    all_groups = {"rollout/zero_std/count_0.0": 5.0, "rollout/zero_std/count_1.0": 3.0}  # 8 of 8 groups
    plain = _stream(
        InstabilityMonitor(_cfg(advantage_estimator="reinforce_plus_plus", normalize_advantages=True)), 6, r5=all_groups
    )
    assert plain == []
    grpo = _stream(InstabilityMonitor(_cfg()), 6, r5=all_groups)
    assert [(f.rule, f.rollout_id) for f in grpo] == [("zero_advantage_groups", 5)]


@pytest.mark.parametrize(
    "fields",
    [
        {"loss_type": "sft_loss"},
        {"loss_type": "sft_loss", "disable_compute_advantages_and_returns": True, "calculate_per_token_loss": True},
        {
            "loss_type": "custom_loss",
            "custom_loss_function_path": "m.f",
            "disable_compute_advantages_and_returns": True,
        },
    ],
)
def test_equal_rewards_do_not_warn_where_the_loss_reads_no_advantage(fields):
    # Reproducer: the original's SFT recipe (slime.rollout.sft_rollout, reward 0 in every group of one, GRPO the
    # default estimator) warned "INSTABILITY at rollout 0: zero_advantage_groups ... 2 of 2 groups (100.0%)" on every
    # run, though sft_loss (and a loss given no advantages) never reads one.
    all_groups = {"rollout/zero_std/count_0.0": 8.0}  # 8 of 8 groups
    assert _stream(InstabilityMonitor(_cfg(rollout_max_response_len=None, **fields)), 6, r0=all_groups) == []
    # The same stream under the policy loss still warns.
    found = _stream(InstabilityMonitor(_cfg(rollout_max_response_len=None)), 6, r0=all_groups)
    assert [(f.rule, f.rollout_id) for f in found] == [("zero_advantage_groups", 0)]


def test_equal_rewards_do_not_warn_under_on_policy_distillation():
    # Reproducer: `uv run python -m slime_app.demo.opd` (no task reward: every group's rewards are 0) warned
    # "INSTABILITY at rollout 0: zero_advantage_groups ... 64 of 64 groups (100.0%) have equal rewards (zero
    # advantage)", though the OPD term -λ·(log p_student - log p_teacher) is in every token's advantage.
    all_groups = {"rollout/zero_std/count_0.0": 8.0}  # 8 of 8 groups
    opd = {"use_opd": True, "opd_type": "sglang", "rm_url": "http://127.0.0.1:1/generate"}
    assert _stream(InstabilityMonitor(_cfg(rollout_max_response_len=None, **opd)), 6, r0=all_groups) == []
    # Without a weight on the OPD term, equal rewards zero the advantage again.
    off = _stream(InstabilityMonitor(_cfg(rollout_max_response_len=None, **opd, opd_kl_coef=0.0)), 6, r0=all_groups)
    assert [(f.rule, f.rollout_id) for f in off] == [("zero_advantage_groups", 0)]
