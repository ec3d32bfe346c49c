"""`GoodputMeter`: token and time accounting over synthetic rollouts, values computed by hand."""

import json

import pytest

from slime_app.goodput import GoodputMeter
from slime_app.run_state import load_run_state, save_run_state
from slime_core.config import SlimeArgs


def _meter(**fields):
    cfg = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 2, **fields})
    return GoodputMeter(cfg)


def _rollout(**overrides):
    """One rollout: 100 tokens generated, 30 trained, 50 zero-advantage, 20 filtered; a 10 s step."""
    metrics = {
        "goodput/tokens_generated": 100.0,
        "goodput/tokens_trained": 30.0,
        "goodput/tokens_zero_advantage": 50.0,
        "goodput/tokens_filtered": 20.0,
        "goodput/tokens_truncated": 5.0,
        "perf/rollout_wait_time": 4.0,
        "perf/rollout_time": 3.5,
        "perf/log_probs_time": 1.0,
        "perf/ref_log_probs_time": 0.5,
        "perf/actor_train_time": 2.5,
        "perf/update_weights_time": 0.5,
        "perf/engine_release_time": 0.25,
        "perf/sleep_time": 0.25,
        "perf/step_time": 10.0,
    }
    metrics.update(overrides)
    return metrics


def test_colocated_shares_and_cumulative_counts():
    meter = _meter(colocate=True, actor_num_gpus_per_node=2)  # 2 devices shared by trainer and engines
    out = meter.update(_rollout())
    assert out["goodput/trained_fraction"] == pytest.approx(0.3)
    assert out["goodput/time/log_probs"] == pytest.approx(1.5)
    assert out["goodput/time/swap"] == pytest.approx(0.5)
    # other = 10 - (4 + 1.5 + 2.5 + 0.5 + 0.5) = 1.0
    assert out["goodput/time/other"] == pytest.approx(1.0)
    # Colocated: training (log-probs + train = 4 s) over the 10 s step, on every device.
    assert out["goodput/train_device_share"] == pytest.approx(0.4)
    meter.add_eval(5.0)
    out = meter.update(_rollout(**{"goodput/tokens_trained": 70.0, "goodput/tokens_zero_advantage": 10.0}))
    assert out["goodput/cum/tokens_generated"] == 200.0
    assert out["goodput/cum/tokens_trained"] == 100.0
    assert out["goodput/cum/trained_fraction"] == pytest.approx(0.5)
    assert out["goodput/cum/wall_time"] == pytest.approx(25.0)  # two 10 s steps + the 5 s eval
    assert out["goodput/cum/train_device_share"] == pytest.approx(8.0 / 25.0)
    # 100 trained tokens over 25 s × 2 devices = 50/3600 device-hours.
    assert out["goodput/cum/trained_tokens_per_device_hour"] == pytest.approx(100 / (50 / 3600))


def test_disaggregated_device_share_weights_trainer_devices():
    meter = _meter(actor_num_gpus_per_node=1, rollout_num_gpus=3)  # 1 trainer + 3 engine devices
    out = meter.update(_rollout())
    # 4 s of training on 1 of 4 devices during a 10 s step.
    assert out["goodput/train_device_share"] == pytest.approx(4.0 / 40.0)


@pytest.mark.parametrize(
    "fields", [{"debug_train_only": True}, {"load_debug_rollout_data": "/tmp/dump_{rollout_id}.pt"}]
)
def test_a_run_without_engines_counts_only_the_trainer_devices(fields):
    # Reproducer: the original's SFT recipe (--debug-train-only, no engine starts) reported "1 trainer + 1 engine
    # device(s)" and half its training share of device time (goodput/train_device_share 0.2 for 4 s of a 10 s step).
    meter = _meter(actor_num_gpus_per_node=1, rollout_num_gpus=3, **fields)
    out = meter.update(_rollout())
    assert out["goodput/train_device_share"] == pytest.approx(4.0 / 10.0)
    assert out["goodput/cum/trained_tokens_per_device_hour"] == pytest.approx(30 / (10 / 3600))
    assert "1 trainer + 0 engine device(s)" in meter.summary()


def test_summary_and_json(tmp_path):
    meter = _meter(colocate=True)
    meter.update(_rollout())
    text = meter.summary()
    assert "30.0% of generated tokens trained on, 40.0% of device time in training" in text
    assert "dropped by the dynamic filter" in text and "20.0%" in text
    assert len(text.splitlines()) <= 24  # one screen
    data = json.loads(open(meter.save(str(tmp_path / "goodput.json"))).read())
    assert data["goodput/cum/tokens_generated"] == 100.0 and data["time"]["train"] == 2.5


def test_summary_names_the_earlier_policies_masked_tokens_only_when_there_are_some():
    meter = _meter(colocate=True)
    meter.update(_rollout())
    assert "earlier policies" not in meter.summary()
    # --mask-offpolicy-in-partial-rollout: 40 of 140 generated tokens were the earlier rollouts' part, masked.
    meter.update(_rollout(**{"goodput/tokens_generated": 140.0, "goodput/tokens_offpolicy_masked": 40.0,
                             "goodput/tokens_requeued": 12.0}))  # fmt: skip
    text = meter.summary()
    line = next(x for x in text.splitlines() if "earlier policies' part, masked" in x)
    assert line.split()[-2:] == ["40", "16.7%"]  # of 240 generated over the two rollouts
    assert meter.cumulative()["goodput/cum/tokens_offpolicy_masked"] == 40.0
    assert len(text.splitlines()) <= 24


def test_totals_kept_with_a_checkpoint_continue_and_a_missing_or_damaged_file_starts_at_zero(tmp_path, caplog):
    meter = _meter(colocate=True)
    meter.update(_rollout())
    meter.add_eval(5.0)
    save_run_state(tmp_path, 0, {"goodput": meter.state()})
    resumed = _meter(colocate=True)
    assert load_run_state(tmp_path, 0, {"goodput": resumed}) == ["goodput"]
    out = resumed.update(_rollout())
    assert out["goodput/cum/tokens_generated"] == 200.0 and out["goodput/cum/wall_time"] == pytest.approx(25.0)
    assert resumed.num_rollouts == 2
    # Megatron's `--load <save>/iter_0000000`: the state is read from the save folder beside it.
    assert load_run_state(tmp_path / "iter_0000000", 0, {"goodput": _meter(colocate=True)}) == ["goodput"]
    (tmp_path / "rollout" / "run_state_1.json").write_text("{not json")
    save_run_state(tmp_path, 2, {"goodput": {"tokens": "none"}})
    for rollout_id, said in ((1, "not read (JSONDecodeError"), (2, "its goodput part not read"), (3, "is missing")):
        fresh = _meter(colocate=True)
        with caplog.at_level("WARNING"):
            assert load_run_state(tmp_path, rollout_id, {"goodput": fresh}) == []
        assert said in caplog.records[-1].getMessage()
        assert str(tmp_path / "rollout" / f"run_state_{rollout_id}.json") in caplog.records[-1].getMessage()
        assert fresh.cumulative()["goodput/cum/tokens_generated"] == 0.0 and fresh.num_rollouts == 0


def test_an_sft_summary_names_dataset_tokens_and_no_advantage():
    # Reproducer: the SFT recipe's summary read "of generated tokens trained on", "tokens generated" and
    # "trained on (non-zero advantage)", with a "zero advantage" row: SFT generates nothing and reads no advantage.
    meter = _meter(colocate=True, loss_type="sft_loss", disable_compute_advantages_and_returns=True)
    meter.update(_rollout(**{"goodput/tokens_trained": 80.0, "goodput/tokens_zero_advantage": 0.0}))
    text = meter.summary()
    assert "80.0% of dataset response tokens trained on, 40.0% of device time in training" in text
    assert "  tokens of the dataset responses 100:" in text
    lines = text.splitlines()
    assert any(line.split() == ["trained", "on", "(loss", "mask", "1)", "80", "80.0%"] for line in lines)
    assert "generated" not in text and "advantage" not in text
    rl = _meter(colocate=True).summary()  # an RL run keeps its words
    assert "of generated tokens trained on" in rl and "trained on (non-zero advantage)" in rl
