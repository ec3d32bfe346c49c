"""The config's warnings (`SlimeArgs`): flags that have no effect in the run they are given to say so in one line,
and flags that do have an effect say nothing. The refusals are in test_config_validation.py."""

import logging

import pytest

from slime_core.config import ConfigError, SlimeArgs
from slime_core.config import base as config_base

BASE = {"rollout_batch_size": 4, "num_rollout": 1}


pytestmark = pytest.mark.usefixtures("fresh_config_state")


def make(**overrides):
    return SlimeArgs.from_dict({**BASE, **overrides})


def test_no_effect_warnings(caplog):
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(advantage_estimator="cispo")
        make(kl_loss_coef=0.1)
    messages = [r.getMessage() for r in caplog.records]
    assert any("CISPO with --eps-clip 0.2 < 1" in m for m in messages)
    assert any("--kl-loss-coef has no effect without --use-kl-loss" in m for m in messages)


def test_policy_loss_terms_with_the_sft_loss_are_one_warning_naming_them(caplog):
    # The NLL reads none of them (the original's sft_loss_function neither): an RL script turned into SFT kept
    # --use-kl-loss (a reference model loaded and run every step) and --entropy-coef, without a word.
    sft = {"loss_type": "sft_loss", "disable_compute_advantages_and_returns": True, "hf_checkpoint": "m"}
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(**sft)
        assert caplog.records == []
        make(**sft, use_kl_loss=True, kl_loss_coef=0.1, entropy_coef=0.01, use_tis=True)
    assert [r.getMessage() for r in caplog.records] == [
        "--loss-type sft_loss: --use-kl-loss, --entropy-coef 0.01, --use-tis have no effect (the loss is the "
        "negative log-likelihood of the trained tokens only); drop them"
    ]
    caplog.clear()
    config_base._WARNED.clear()
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(**sft, advantage_estimator="ppo")  # a critic trained every step for a loss that reads no value
    assert [r.getMessage() for r in caplog.records] == [
        "--loss-type sft_loss: --advantage-estimator ppo (its critic) has no effect (the loss is the negative "
        "log-likelihood of the trained tokens only); drop them"
    ]


def test_flags_only_tis_or_the_critic_read_are_not_silent(caplog):
    # --tis-clip without --use-tis and --value-clip without a critic changed nothing and said nothing.
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(tis_clip=3.0)
    assert "--tis-clip has no effect without --use-tis or --get-mismatch-metrics" in [
        r.getMessage() for r in caplog.records
    ]
    make(tis_clip=3.0, use_tis=True)  # read: no error
    with pytest.raises(ConfigError, match=r"^--value-clip configures the PPO critic; it has no effect with "):
        make(value_clip=0.3)
    assert make(value_clip=0.3, advantage_estimator="ppo").value_clip == 0.3


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"tis_mode": "icepop"}, "--tis-mode has no effect without --use-tis or --get-mismatch-metrics"),
        (
            {"tis_clip": 3.0, "tis_mode": "icepop"},
            "--tis-clip and --tis-mode have no effect without --use-tis or --get-mismatch-metrics",
        ),
        ({"opsm_delta": 0.1}, "--opsm-delta has no effect without --use-opsm"),
        ({"opd_kl_coef": 0.5}, "--opd-kl-coef 0.5 has no effect without --use-opd"),
        ({"lora_alpha": 32.0}, "--lora-alpha: no effect without --lora-rank (LoRA is off)"),
        (
            {"lora_target_modules": ["q_proj"], "lora_save_merged": True},
            "--lora-target-modules / --lora-save-merged: no effect without --lora-rank (LoRA is off)",
        ),
    ],
)
def test_knobs_of_a_feature_that_is_off_are_not_silent(caplog, overrides, message):
    # Was: accepted without a word while their switch (--use-tis, --use-opsm, --use-opd, --lora-rank) was off; the
    # loss never read them. (A --custom-tis-function-path that would never be called is refused: the test below.)
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(**overrides)
    assert message in [r.getMessage() for r in caplog.records]


def test_opd_with_a_zero_kl_coef_says_the_teacher_does_not_train(caplog):
    # Was: accepted without a word; the teacher scored every sample while `a - 0 * (student - teacher)` left the
    # advantages as they were (with the original's pure-distillation plugins, every advantage 0: nothing trains).
    opd = {"use_opd": True, "opd_type": "sglang", "rm_url": "http://t:1/generate"}
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(**opd)
        make(**opd, opd_kl_coef=0.5)
        assert caplog.records == []
        make(**opd, opd_kl_coef=0.0)
    assert [r.getMessage() for r in caplog.records] == [
        "--use-opd with --opd-kl-coef 0: the teacher's log-probs do not enter the advantages (only the "
        "opd_reverse_kl metric is logged), yet the teacher scores every sample; give a positive --opd-kl-coef "
        "or drop --use-opd"
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        {"tis_mode": "icepop", "use_tis": True},
        {"custom_tis_function_path": "m.f", "get_mismatch_metrics": True},
        {"opsm_delta": 0.1, "use_opsm": True},
    ],
)
def test_knobs_of_a_feature_that_is_on_say_nothing(caplog, overrides):
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(**overrides)
    assert not [r for r in caplog.records if "no effect without" in r.getMessage()]


def test_eval_only_flags_without_eval_data_warn_once_in_one_line(caplog):
    with caplog.at_level(logging.WARNING):
        # The derived --eval-max-context-len (= --rollout-max-context-len) is not a user's setting.
        assert make(rollout_max_context_len=4096).eval_max_context_len == 4096
        args = make(n_samples_per_eval_prompt=4, eval_top_p=0.9, eval_max_response_len=100, skip_eval_before_train=True)
        SlimeArgs.from_dict(args.model_dump())  # re-validated in a worker: no second line
        make(eval_prompt_data=["gsm8k", "g.jsonl"], eval_top_p=0.9)  # with eval data: read
    lines = [r.getMessage() for r in caplog.records if "without eval data" in r.getMessage()]
    assert lines == [
        "--skip-eval-before-train --n-samples-per-eval-prompt --eval-top-p --eval-max-response-len: no effect "
        "without eval data (--eval-prompt-data or --eval-config)"
    ]
    # The original asserts on --eval-interval without eval datasets: still an error here.
    with pytest.raises(ConfigError, match="--eval-interval requires --eval-prompt-data or --eval-config"):
        make(eval_interval=5)


def test_multi_turn_flags_with_the_default_generate_function_warn(caplog):
    # --env-path search --max-turns 3 without the multi-turn generate function ran single-turn, env unused, silently.
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(env_path="search", max_turns=3)
    lines = [r.getMessage() for r in caplog.records if "single-turn generate function" in r.getMessage()]
    assert lines == [
        "--env-path and --max-turns have no effect with the default single-turn generate function (samples whose "
        "generate_function_path names another aside); set --custom-generate-function-path "
        "slime_rollout.generation.multi_turn.generate"
    ]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(env_path="search", max_turns=3, custom_generate_function_path="slime_rollout.multi_turn.generate")
    assert not [r for r in caplog.records if "single-turn" in r.getMessage()]


def test_grpo_on_single_sample_groups_warns_that_every_advantage_is_zero(caplog):
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(n_samples_per_prompt=1, advantage_estimator="grpo")
        make(n_samples_per_prompt=1, advantage_estimator="grpo")  # re-validated in every worker: said once
    warned = [r.getMessage() for r in caplog.records if "--n-samples-per-prompt 1" in r.getMessage()]
    assert warned == [
        "--n-samples-per-prompt 1 with --advantage-estimator grpo: every prompt group holds one sample, so every "
        "reward minus its group's mean is 0: all advantages and the policy-gradient loss are 0 (only a KL or "
        "entropy term trains); use --n-samples-per-prompt 2 or more"
    ]


@pytest.mark.parametrize(
    "overrides",
    [
        {"n_samples_per_prompt": 2, "global_batch_size": 8},
        {"loss_type": "sft_loss"},
        {"custom_reward_post_process_path": "my.post"},
        {"debug_rollout_only": True},
    ],
)
def test_single_sample_groups_are_not_warned_where_something_still_trains(caplog, overrides):
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(advantage_estimator="grpo", **overrides)
    assert not [r for r in caplog.records if "--n-samples-per-prompt 1" in r.getMessage()]


def test_an_eval_only_run_gets_no_training_only_warnings_and_keeps_the_others(caplog):
    # Was: `--num-rollout 0 --eval-interval 1` (nothing trains) still warned that GRPO on groups of one learns nothing.
    flags = {
        "n_samples_per_prompt": 1, "global_batch_size": 4, "advantage_estimator": "grpo", "kl_loss_coef": 0.1,
        "max_tokens_per_gpu": 512, "env_path": "search", "eval_interval": 1, "eval_prompt_data": ["aime", "a.jsonl"],
    }  # fmt: skip
    training_only = ("--n-samples-per-prompt 1", "--kl-loss-coef", "--max-tokens-per-gpu")
    for num_rollout in (0, 1):
        caplog.clear()
        config_base._WARNED.clear()
        with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
            make(**{**flags, "num_rollout": num_rollout})
        said = [r.getMessage() for r in caplog.records]
        assert [any(m.startswith(flag) for m in said) for flag in training_only] == [num_rollout == 1] * 3
        assert any(m.startswith("--env-path has no effect with the default single-turn") for m in said)  # eval too


def test_delta_flags_without_delta_mode_warn_once(caplog):
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(update_weight_delta_encoding="overwrite", update_weight_delta_checksum="adler32")
        make(update_weight_delta_encoding="overwrite")
        make(rollout_engine="reference", weight_sync="tensor", update_weight_mode="delta",
             update_weight_delta_encoding="overwrite")  # fmt: skip
    messages = [r.getMessage() for r in caplog.records if "update-weight" in r.getMessage()]
    assert messages == [
        "--update-weight-delta-encoding / --update-weight-delta-checksum: no effect without --update-weight-mode delta"
    ]


def test_update_weights_interval_without_async_says_the_sync_loop_pushes_every_step(caplog):
    # Was: accepted silently, while the sync loop pushed after every step (as the original's train.py): a run asking
    # for pushes every 2 rollouts trained fully on-policy with no word.
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(update_weights_interval=1)
        make(async_train=True, update_weights_interval=2)  # read by the --async schedule: nothing to say
        make(update_weights_interval=2)
        make(update_weights_interval=2)
    messages = [r.getMessage() for r in caplog.records if "--update-weights-interval" in r.getMessage()]
    assert messages == [
        "--update-weights-interval 2 has no effect without --async: the sync loop pushes the weights after every step "
        "(as the original's train.py); add --async to push every 2 rollouts"
    ]


def test_a_local_checkpoint_dir_without_delta_mode_says_it_is_not_used(caplog, tmp_path):
    # Was: a full disk sync accepted --update-weight-local-checkpoint-dir (the original's engines copy each version
    # there and load it from there) and said nothing, while the engines read --update-weight-disk-dir.
    disk = {"weight_sync": "disk", "update_weight_disk_dir": str(tmp_path / "shared")}
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(**disk)  # not given: nothing to say
        make(**disk, update_weight_local_checkpoint_dir=str(tmp_path / "nvme"))
        make(**disk, update_weight_local_checkpoint_dir=str(tmp_path / "nvme"))
        delta = make(**disk, update_weight_mode="delta", update_weight_local_checkpoint_dir=str(tmp_path / "nvme"))
    assert delta.update_weight_local_checkpoint_dir == str(tmp_path / "nvme")  # read by the delta push
    messages = [r.getMessage() for r in caplog.records if "local-checkpoint-dir" in r.getMessage()]
    assert messages == [
        "--update-weight-local-checkpoint-dir: no effect without --update-weight-mode delta; a full disk sync's "
        "engines load each version from --update-weight-disk-dir (the original copies it into that folder on each "
        "engine host first)"
    ]


def test_eval_data_without_eval_interval_says_no_eval_runs(caplog):
    # As the original, eval data alone runs no eval (its scripts turn eval off by leaving --eval-interval out): said
    # once, so a user who meant to evaluate learns why no eval/ curve appears.
    with caplog.at_level(logging.WARNING):
        args = make(eval_prompt_data=["aime", "a.jsonl"])
        SlimeArgs.from_dict(args.model_dump())  # re-validated in a worker: no second line
        make(eval_prompt_data=["aime", "a.jsonl"], eval_interval=5)
    lines = [r.getMessage() for r in caplog.records if "--eval-interval" in r.getMessage()]
    assert lines == [
        "--eval-prompt-data without --eval-interval: no eval runs (as in the original); set --eval-interval N to "
        "evaluate before training and every N rollouts"
    ]


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        ({"debug_rollout_only": True}, "--debug-rollout-only (no trainer runs)"),
        (
            {"num_rollout": 0, "eval_interval": 1, "eval_prompt_data": ["d", "d.jsonl"]},
            "--num-rollout 0 (an eval-only run: nothing is trained)",
        ),
    ],
)
def test_saves_of_a_run_that_trains_nothing_say_that_nothing_is_saved(caplog, overrides, why):
    # The loop saves and exports after trained rollouts only: the folders stayed empty, unannounced.
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(save="/ck", save_hf="/hf", **overrides)
        make(save="/ck", save_hf="/hf")  # a training run writes both: no second line
    assert [r.getMessage() for r in caplog.records if "nothing is saved" in r.getMessage()] == [
        f"--save and --save-hf: nothing is saved with {why}; checkpoints and HF exports follow trained rollouts"
    ]


def test_ref_update_interval_is_at_least_one_and_says_when_no_reference_is_loaded(caplog):
    # 0 was accepted and never refreshed the reference (`interval and ...` is false); the original divides by it
    # (ZeroDivisionError after the first rollout). Without --use-kl-loss / --kl-coef no reference model is loaded.
    for bad in (0, -2):
        with pytest.raises(ConfigError, match="--ref-update-interval"):
            make(ref_update_interval=bad)
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(ref_update_interval=2, use_kl_loss=True, kl_loss_coef=0.1, hf_checkpoint="m")
        make(ref_update_interval=2)
    assert [r.getMessage() for r in caplog.records if "--ref-update-interval" in r.getMessage()] == [
        "--ref-update-interval 2 has no effect without a reference model (--use-kl-loss or --kl-coef)"
    ]


def test_schedule_flags_the_schedule_never_reads_say_so(caplog):
    # megatron-core's get_lr (and FSDP's copy) returns --lr after the warmup under the constant style, and starts a
    # warmup at --lr-warmup-init: these were accepted and changed nothing, without a word.
    with caplog.at_level(logging.WARNING, logger="slime_core.config.base"):
        make(lr_decay_style="cosine", min_lr=1e-7, lr_decay_iters=10, lr_warmup_iters=2, lr_warmup_init=1e-8)
        make(lr_warmup_fraction=0.1, lr_warmup_init=1e-8)
        make(min_lr=1e-7, lr_decay_iters=10)
        make(lr_warmup_init=1e-8)
    assert [r.getMessage() for r in caplog.records if "-lr-" in r.getMessage()] == [
        "--min-lr 1e-07 and --lr-decay-iters 10 have no effect with --lr-decay-style constant: the learning rate "
        "stays --lr after the warmup",
        "--lr-warmup-init 1e-08 has no effect without a warmup (--lr-warmup-iters or --lr-warmup-fraction): the "
        "first step runs at --lr",
    ]
