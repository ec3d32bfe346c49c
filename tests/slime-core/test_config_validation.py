"""Validation rules and derived defaults of `SlimeArgs` (slime-features.md §9)."""

import re

import pytest

from slime_core.config import ConfigError, SlimeArgs, parse_args, validation
from slime_core.config.opd import builtin_teacher_scoring

BASE = {"rollout_batch_size": 4, "num_rollout": 1}


pytestmark = pytest.mark.usefixtures("fresh_config_state")


def make(**overrides):
    return SlimeArgs.from_dict({**BASE, **overrides})


# (overrides, a fragment of the one-line error that names the flags)
BROKEN_RULES = [
    ({"kl_coef": 0.1, "kl_loss_coef": 0.1, "hf_checkpoint": "m"}, "--kl-coef and --kl-loss-coef cannot both"),
    ({"use_kl_loss": True, "kl_loss_coef": 0.01}, "give --ref-load or --hf-checkpoint"),
    ({"kl_coef": 0.05}, "give --ref-load or --hf-checkpoint"),
    ({"advantage_estimator": "reinforce_plus_plus"}, "reinforce_plus_plus requires --normalize-advantages"),
    ({"advantage_estimator": "reinforce_plus_plus_baseline"}, "baseline requires --normalize-advantages"),
    ({"eps_clip_c": 1.0}, "--eps-clip-c must be > 1"),
    ({"use_rollout_logprobs": True, "use_tis": True}, "--use-rollout-logprobs and --use-tis are mutually exclusive"),
    ({"tis_clip_low": 3.0}, "--tis-clip-low (3.0) must be <= --tis-clip (2.0)"),
    ({"rollout_temperature": 0.0}, "--rollout-temperature: Input should be greater than 0"),
    ({"eval_temperature": -1.0}, "--eval-temperature: Input should be greater than or equal to 0"),
    ({"over_sampling_batch_size": 3}, "--over-sampling-batch-size (3) must be >= --rollout-batch-size (4)"),
    ({"n_samples_per_prompt": 2, "num_steps_per_rollout": 3}, "--num-steps-per-rollout 3 does not divide"),
    ({"n_samples_per_prompt": 2, "global_batch_size": 3}, "--global-batch-size 3 does not divide"),
    (
        {"n_samples_per_prompt": 2, "global_batch_size": 4, "num_steps_per_rollout": 4},
        "--global-batch-size 4 * --num-steps-per-rollout 4 != --rollout-batch-size * --n-samples-per-prompt = 4 * 2",
    ),
    ({"micro_batch_size": 3}, "--micro-batch-size 3 does not divide --global-batch-size 4"),
    ({"critic_lr": 1e-5}, "--critic-lr configures the PPO critic; it has no effect with --advantage-estimator grpo"),
    ({"num_critic_only_steps": 2}, "--num-critic-only-steps configures the PPO critic"),
    (
        {"advantage_estimator": "ppo", "critic_num_gpus_per_node": 4},
        "--critic-num-nodes x --critic-num-gpus-per-node = 4 must equal the actor's 8 GPUs",
    ),
    ({"use_opd": True}, "--use-opd requires --opd-type sglang"),
    ({"use_opd": True, "opd_type": "sglang"}, "--opd-type sglang needs the teacher engine's generate URL: --rm-url"),
    (
        {"use_opd": True, "opd_type": "sglang", "rm_url": "http://t/generate", "rm_type": "remote_rm"},
        "--opd-type sglang scores the teacher at --rm-url, which --rm-type remote_rm also uses",
    ),
    ({"use_opd": True, "opd_type": "sglang", "opd_teacher_load": "/"}, "remove --opd-teacher-load"),
    ({"use_opd": True, "opd_type": "megatron"}, "--opd-type megatron requires --opd-teacher-load"),
    ({"use_opd": True, "opd_type": "fsdp", "opd_teacher_load": "/"}, "--opd-type fsdp needs --train-backend fsdp"),
    (
        {"use_opd": True, "opd_type": "megatron", "opd_teacher_load": "/no/such/teacher"},
        "--opd-teacher-load /no/such/teacher does not exist",
    ),
    ({"opd_teacher_load": "/"}, "--opd-teacher-load is set but --use-opd is not"),
    (
        {
            "use_opd": True,
            "opd_type": "sglang",
            "rm_url": "http://t/generate",
            "custom_rm_path": "slime.rollout.on_policy_distillation.reward_func",
        },
        "--custom-rm-path slime.rollout.on_policy_distillation.reward_func returns the teacher's reply, not a reward: "
        "add --custom-reward-post-process-path slime.rollout.on_policy_distillation.post_process_rewards",
    ),
    ({"num_rollout": None}, "--num-rollout or --num-epoch is required"),
    ({"num_rollout": 0}, "--num-rollout 0 trains nothing; with --eval-interval"),
    ({"num_rollout": 0, "eval_interval": 1}, "--eval-interval requires --eval-prompt-data or --eval-config"),
    ({"num_rollout": None, "num_epoch": 2, "disable_rollout_global_dataset": True}, "--num-epoch counts passes"),
    ({"rollout_num_gpus_per_engine": 16}, "--rollout-num-gpus-per-engine 16 exceeds --num-gpus-per-node 8"),
    (
        {"rollout_num_gpus": 1, "rollout_num_gpus_per_engine": 2},
        "--rollout-num-gpus 1 is not a multiple of --rollout-num-gpus-per-engine 2: one engine needs 2 GPUs and only "
        "1 are given",
    ),
    (
        {"colocate": True, "actor_num_gpus_per_node": 6, "rollout_num_gpus_per_engine": 4},
        "--rollout-num-gpus 6 (with --colocate: 6 shared with the trainer) is not a multiple of "
        "--rollout-num-gpus-per-engine 4: 1 engine(s) of 4 GPUs would leave 2 GPU(s) idle",
    ),
    (
        {"colocate": True, "actor_num_gpus_per_node": 1, "rollout_num_gpus": 3, "rollout_num_gpus_per_engine": 2},
        "--rollout-num-gpus 3 (with --colocate: 1 shared with the trainer, 2 rollout-only) is not a multiple of "
        "--rollout-num-gpus-per-engine 2",
    ),
    ({"offload": True, "rollout_num_gpus": 4}, "--offload-train (or --offload) without --colocate"),
    ({"eval_prompt_data": ["aime", "a.jsonl", "gsm8k"]}, "--eval-prompt-data takes pairs"),
    ({"save_hf": "/out/{step}"}, "--save-hf '/out/{step}': cannot be filled in with rollout_id=0 (KeyError: 'step')"),
    ({"save_hf": "/out/{}"}, "--save-hf '/out/{}': cannot be filled in with rollout_id=0 (KeyError: '')"),
    ({"eval_prompt_data": ["a", "x.jsonl", "a", "y.jsonl"]}, "--eval-prompt-data: duplicate dataset names"),
    ({"eval_interval": 5}, "--eval-interval requires --eval-prompt-data or --eval-config"),
    ({"save_interval": 5}, "--save-interval requires --save"),
    ({"use_dynamic_batch_size": True}, "--use-dynamic-batch-size requires --max-tokens-per-gpu"),
    ({"balance_by_flops": True}, "--balance-by-flops requires --use-dynamic-batch-size"),
    ({"rollout_max_context_len": 100, "rollout_max_prompt_len": 100}, "--rollout-max-prompt-len (100) must be <="),
    ({"debug_rollout_only": True, "debug_train_only": True}, "--debug-rollout-only and --debug-train-only"),
    ({"debug_rollout_only": True, "load_debug_rollout_data": "d_{rollout_id}.pt"}, "--debug-rollout-only and"),
    ({"colocate": True, "rollout_num_gpus": 4}, "--rollout-num-gpus 4 is smaller than the 8 actor GPUs"),
    ({"colocate": True, "async_train": True}, "--async overlaps rollout and training"),
    ({"loss_type": "custom_loss"}, "--loss-type custom_loss requires --custom-loss-function-path"),
    ({"disable_compute_advantages_and_returns": True}, "leaves the policy loss without advantages"),
    ({"only_train_params_name_list": ["a"], "freeze_params_name_list": ["b"]}, "are mutually exclusive"),
    ({"bf16": True, "fp16": True}, "--bf16 and --fp16 are mutually exclusive"),
    ({"lr_warmup_iters": 2, "lr_warmup_fraction": 0.1}, "--lr-warmup-iters and --lr-warmup-fraction are mutually"),
    ({"update_weight_transport": "disk"}, "--update-weight-transport disk requires --update-weight-disk-dir"),
    ({"sglang_args": {"dp_size": "2"}}, "--sglang-dp-size > 1 requires --sglang-enable-dp-attention"),
    ({"sglang_args": {"pp_size": "2"}}, "--rollout-num-gpus-per-engine 1 must be divisible by --sglang-pp-size 2"),
    ({"sglang_args": {"pp_size": True}}, "--sglang-pp-size: expected an integer"),
    (
        {"rollout_external_engine_addrs": ["h:1"], "rollout_engine_urls": ["http://h:2"]},
        "--rollout-external-engine-addrs and --rollout-engine-urls disagree",
    ),
    ({"megatron_args": ["--tensor-model-parallel-size", "x"]}, "--tensor-model-parallel-size: expected an integer"),
    # SGLang refuses these on every request (the run failed at its first rollout); issue 27.
    ({"rollout_top_k": -5}, "--rollout-top-k -5: top-k is -1 (off) or at least 1, as SGLang takes it"),
    ({"rollout_top_k": 0}, "--rollout-top-k 0: top-k is -1 (off) or at least 1"),
    ({"eval_top_k": 0}, "--eval-top-k 0: top-k is -1 (off) or at least 1"),
    # Runs that started Ray and the trainer to do nothing (issue 27, pass 51).
    (
        {"num_rollout": 0, "eval_interval": 1, "eval_prompt_data": ["d", "d.jsonl"], "debug_train_only": True},
        "--num-rollout 0 only evaluates, and --debug-train-only (or --load-debug-rollout-data) starts no engine",
    ),
    (
        {"num_rollout": 0, "eval_interval": 1, "eval_prompt_data": ["d", "d.jsonl"], "load_debug_rollout_data": "x"},
        "--num-rollout 0 only evaluates, and --debug-train-only (or --load-debug-rollout-data) starts no engine",
    ),
    ({"start_rollout_id": 3, "num_rollout": 3}, "--start-rollout-id 3 is not below --num-rollout 3: the run would"),
    # megatron-core's OptimizerParamScheduler asserted these at trainer start; FSDP's decay raised the rate.
    (
        {"train_backend": "fsdp", "lr": 1e-4, "min_lr": 1e-3, "lr_decay_style": "cosine"},
        "--min-lr 0.001 is above --lr 0.0001: the cosine schedule decays from --lr down to --min-lr",
    ),
    ({"train_backend": "megatron", "lr": 1e-4, "min_lr": 1e-3}, "--min-lr 0.001 is above --lr 0.0001: the constant"),
    (
        {"train_backend": "megatron", "lr": 1e-4, "lr_warmup_iters": 2, "lr_warmup_init": 1e-3},
        "--lr-warmup-init 0.001 is above --lr 0.0001: the warmup rises from it to --lr",
    ),
    (
        {"advantage_estimator": "ppo", "lr": 1e-3, "critic_lr": 1e-5, "min_lr": 1e-4, "lr_decay_style": "linear"},
        "--min-lr 0.0001 is above --critic-lr 1e-05: the linear schedule decays from --critic-lr",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), BROKEN_RULES, ids=[str(i) for i in range(len(BROKEN_RULES))])
def test_broken_rule_names_the_flags(overrides, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        make(**overrides)
    assert "\n" not in str(info.value)


def test_broken_rule_from_the_command_line():
    with pytest.raises(ConfigError, match=re.escape("--eps-clip-c must be > 1 (dual clip), got 0.5")):
        parse_args(["--rollout-batch-size", "4", "--num-rollout", "1", "--eps-clip-c", "0.5"])


def test_valid_combinations_pass():
    assert make(use_kl_loss=True, kl_loss_coef=0.01, ref_load="/ref").with_ref
    assert make(kl_coef=0.05, hf_checkpoint="/hf").with_ref
    assert make(advantage_estimator="reinforce_plus_plus", normalize_advantages=True).advantage_estimator
    assert make(eps_clip_c=3.0).eps_clip_c == 3.0
    assert make(use_tis=True).use_tis and make(use_rollout_logprobs=True).use_rollout_logprobs
    assert make(rollout_num_gpus_per_engine=4, num_gpus_per_node=4).num_gpus_per_node == 4
    assert make(eval_interval=5, eval_prompt_data=["gsm8k", "g.jsonl"]).eval_datasets == [("gsm8k", "g.jsonl")]
    dp_attention = {"dp_size": "2", "enable_dp_attention": True}  # over an engine's 2 TP ranks
    assert make(sglang_args=dp_attention, rollout_num_gpus_per_engine=2).sglang_args["dp_size"] == "2"
    assert make(rollout_num_gpus_per_engine=4, sglang_args={"pp_size": "2"}).rollout_num_gpus_per_engine == 4
    assert make(colocate=True, rollout_num_gpus=0, rollout_engine_urls=["http://h:1"]).rollout_num_gpus == 0
    assert make(rollout_num_gpus=0, debug_train_only=True).rollout_num_gpus == 0
    assert make(colocate=True, rollout_num_gpus=12).rollout_num_gpus == 12  # extra rollout-only GPUs


@pytest.mark.parametrize(
    ("rbs", "n", "gbs", "steps", "expected"),
    [
        (8, 4, None, 2, (16, 2)),  # --num-steps-per-rollout derives --global-batch-size = 8 * 4 / 2
        (8, 4, 8, None, (8, 4)),  # --global-batch-size derives the number of steps = 32 / 8
        (8, 4, 16, 2, (16, 2)),  # both given and consistent
        (8, 4, None, None, (32, 1)),  # neither: one step over the whole rollout
    ],
)
def test_batch_size_derivation(rbs, n, gbs, steps, expected):
    args = make(rollout_batch_size=rbs, n_samples_per_prompt=n, global_batch_size=gbs, num_steps_per_rollout=steps)
    assert (args.global_batch_size, args.num_steps_per_rollout) == expected
    # The invariant of DESIGN.md §1.
    assert args.rollout_batch_size * args.n_samples_per_prompt == args.global_batch_size * args.num_steps_per_rollout


def test_placement_derivations():
    colocated = make(colocate=True, actor_num_nodes=2, actor_num_gpus_per_node=4)
    assert colocated.offload_train and colocated.offload_rollout and colocated.rollout_num_gpus == 8
    assert colocated.weight_sync == "tensor"
    separate = make(rollout_num_gpus=4)
    assert separate.offload_train is False and separate.offload_rollout is False
    # The loop offloads a colocated trainer in any case (with --fsdp-cpu-offload that is nearly free).
    fsdp = make(train_backend="fsdp", colocate=True, fsdp_cpu_offload=True)
    assert fsdp.offload_train is True and fsdp.offload_rollout is True


def test_ppo_critic_placement_and_role_config():
    from slime_core.critic import critic_config

    shared = make(advantage_estimator="ppo", save="/ckpt", load="/ckpt", lr=1e-6, lr_warmup_iters=3)
    assert shared.use_critic and shared.critic_num_nodes is None and shared.critic_num_gpus_per_node is None
    role = critic_config(shared)
    assert (role.lr, role.lr_warmup_iters, role.load, role.save) == (1e-6, 3, "/ckpt/critic", "/ckpt/critic")
    own = make(advantage_estimator="ppo", critic_num_nodes=1, critic_lr=5e-6, critic_lr_warmup_iters=0,
               critic_load="/c", critic_save="/s", save="/out", kl_coef=0.1, hf_checkpoint="/hf")  # fmt: skip
    assert (own.critic_num_nodes, own.critic_num_gpus_per_node) == (1, 8)  # the rest from the actor
    role = critic_config(own)
    assert (role.lr, role.lr_warmup_iters, role.load, role.save) == (5e-6, 0, "/c", "/s")
    assert role.kl_coef == 0 and not role.use_opd and role.save_hf is None  # actor-only terms off
    assert own.kl_coef == 0.1 and SlimeArgs.from_dict(own.to_dict()) == own  # the run config is untouched
    with pytest.raises(ValueError, match="--advantage-estimator grpo trains no critic"):
        critic_config(make())


def test_a_critic_save_without_save_is_refused():
    # Issue 27, hostile pass 31: it was accepted and nothing was ever written there (the driver saves only with --save,
    # whose tracker commits the actor-critic pair).
    with pytest.raises(ConfigError) as e:
        make(advantage_estimator="ppo", critic_save="/s")
    assert str(e.value) == (
        "--critic-save /s needs --save: the critic is saved with the actor's checkpoint, whose tracker commits the "
        "resume point; give --save too"
    )
    assert make(advantage_estimator="ppo", critic_save="/s", save="/out").critic_save == "/s"


def test_opd_configurations(tmp_path):
    sglang = make(use_opd=True, opd_type="sglang", rm_url="http://teacher:1/generate", rm_type="math")
    assert sglang.use_opd and builtin_teacher_scoring(sglang)
    original = make(
        use_opd=True,
        opd_type="sglang",
        rm_url="http://t:1/generate",
        custom_rm_path="slime.rollout.on_policy_distillation.reward_func",
        custom_reward_post_process_path="slime.rollout.on_policy_distillation.post_process_rewards",
    )
    assert not builtin_teacher_scoring(original)  # the original's plugins fetch the teacher
    trainer = make(use_opd=True, opd_type="megatron", opd_teacher_load=str(tmp_path), opd_kl_coef=0.5)
    assert trainer.opd_teacher_load == str(tmp_path) and not builtin_teacher_scoring(trainer)
    assert make(use_opd=True, opd_type="fsdp", opd_teacher_load=str(tmp_path), train_backend="fsdp").use_opd


def test_lora_is_rejected_with_a_critic_or_a_trainer_side_teacher(tmp_path):
    lora = {"lora_rank": 8, "train_backend": "fsdp"}
    assert make(**lora, use_opd=True, opd_type="sglang", rm_url="http://t:1/generate").lora_rank == 8
    with pytest.raises(ConfigError, match="--lora-rank with --advantage-estimator ppo: the critic has no LoRA"):
        make(**lora, advantage_estimator="ppo")
    with pytest.raises(ConfigError, match="--lora-rank with --opd-type fsdp: a trainer-side teacher"):
        make(**lora, use_opd=True, opd_type="fsdp", opd_teacher_load=str(tmp_path))


def test_debug_mode_derivations():
    replay = make(load_debug_rollout_data="/dumps/{rollout_id}.pt")
    assert replay.debug_train_only
    rollout_only = make(debug_rollout_only=True, colocate=True)
    assert not rollout_only.colocate and rollout_only.offload_train is False and rollout_only.offload_rollout is False
    dumps = make(dump_details="/tmp/run")
    assert dumps.save_debug_rollout_data == "/tmp/run/rollout_data/{rollout_id}.pt"
    assert dumps.save_debug_train_data is None  # train batches are not dumped


def test_weight_sync_resolution(monkeypatch):
    assert make().weight_sync == "disk"  # CPU: no NCCL, the reference engine reloads from disk
    assert make(colocate=True).weight_sync == "tensor"
    assert make(update_weight_transport="nccl").weight_sync == "distributed"
    assert make(update_weight_transport="disk", update_weight_disk_dir="/w").weight_sync == "disk"
    assert make(weight_sync="distributed").weight_sync == "distributed"  # explicit choices are kept
    monkeypatch.setattr(validation, "_cuda_available", lambda: True)
    assert make().weight_sync == "distributed"
    assert make(rollout_engine="reference").weight_sync == "disk"


def test_other_derivations():
    args = make(
        rollout_max_context_len=4096,
        use_dynamic_batch_size=True,
        max_tokens_per_gpu=1024,
        balance_by_flops=True,
        rollout_external_engine_addrs=["10.0.0.1:30000", "http://10.0.0.2:30000"],
    )
    assert args.rollout_max_prompt_len == 4095 and args.eval_max_context_len == 4096
    # --balance-by-flops changes the micro-batch packing and, as the original's validation (`args.balance_data =
    # True`), turns on --balance-data: the micro-batches go to the ranks by cost (here they went round-robin).
    assert args.balance_by_flops and args.balance_data
    assert not make(use_dynamic_batch_size=True, max_tokens_per_gpu=1024).balance_data
    assert args.rollout_engine_urls == ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]
    assert make(eps_clip=0.3).eps_clip_high == 0.3
    assert make(n_samples_per_prompt=2).disable_grpo_std_normalization is False
    assert make(n_samples_per_prompt=1).disable_grpo_std_normalization is True


def test_derived_config_round_trips():
    args = make(colocate=True, n_samples_per_prompt=2, num_steps_per_rollout=2, rollout_max_context_len=64)
    assert SlimeArgs.from_dict(args.to_dict()) == args


def test_a_cpu_config_builds_without_the_engines_package():
    # slime-core alone (or a trainer package) must build a config: the engine's record is only read where it
    # decides something (a GPU run's weight transport), so slime_rollout is never imported on CPU.
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['slime_rollout'] = None\n"  # `import slime_rollout` now raises ImportError
        "import torch; torch.cuda.is_available = lambda: False\n"
        "from slime_core.config import SlimeArgs\n"
        "cfg = SlimeArgs.from_dict({'rollout_batch_size': 1, 'num_rollout': 1, 'train_backend': 'fsdp'})\n"
        "print(cfg.weight_sync)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "disk", out.stderr[-2000:]


def test_separate_gpu_engines_default_to_one_engine_of_gpus():
    # Not colocated and without --rollout-num-gpus, SGLang engines were placed on no GPU of their own (engine 0 on
    # GPU 0, trainer rank 0's); the original stopped on the None. One engine's GPUs are now reserved for it.
    assert make(rollout_engine="sglang", rollout_num_gpus_per_engine=2).rollout_num_gpus == 2
    assert make(rollout_engine="sglang", rollout_num_gpus=4).rollout_num_gpus == 4  # given: kept
    assert make(rollout_engine="sglang", colocate=True, actor_num_gpus_per_node=4).rollout_num_gpus == 4
    # No engine GPU to reserve: a CPU engine, outside engines, or no engines at all.
    assert make(rollout_engine="reference").rollout_num_gpus is None
    assert make(rollout_engine="sglang", rollout_engine_urls=["http://h:1"]).rollout_num_gpus is None
    assert make(rollout_engine="sglang", debug_train_only=True).rollout_num_gpus is None
    # --debug-rollout-only drops --colocate; its engines keep the colocated run's GPUs (the original's rule): they
    # were one engine on one GPU.
    rollout_only = make(rollout_engine="sglang", debug_rollout_only=True, colocate=True, actor_num_gpus_per_node=4)
    assert (rollout_only.colocate, rollout_only.rollout_num_gpus) == (False, 4)
    cpu = make(rollout_engine="reference", debug_rollout_only=True, colocate=True, actor_num_gpus_per_node=4)
    assert cpu.rollout_num_gpus is None  # one CPU engine, as before


@pytest.mark.parametrize("colocate", [True, False])
def test_zero_rollout_gpus_need_outside_engines(colocate):
    # It was accepted as "the router only", and the launcher started one engine anyway (on no GPU of its own).
    with pytest.raises(ConfigError, match=r"--rollout-num-gpus 0 starts no engine, and registering outside engines"):
        make(colocate=colocate, rollout_num_gpus=0)


@pytest.mark.parametrize(
    ("overrides", "flag"),
    [
        ({"save": "~/ckpt"}, "--save '~/ckpt'"),
        ({"save_hf": "~/hf_{rollout_id}"}, "--save-hf '~/hf_{rollout_id}'"),
        ({"output_dir": "~user/out"}, "--output-dir '~user/out'"),
        ({"eval_prompt_data": ["ev", "~/e.jsonl"], "eval_interval": 1}, "--eval-prompt-data '~/e.jsonl'"),
    ],
)
def test_a_path_starting_with_a_tilde_is_refused(overrides, flag):
    # Quoted on the command line or written in a --config YAML, "~/ckpt" reached the run as written: the run made a
    # folder named "~" in the working directory.
    with pytest.raises(ConfigError, match=re.escape(f"{flag}: starts with '~', which nothing expands here")):
        make(**overrides)


@pytest.mark.parametrize(("flag", "value"), [("--rollout-temperature", "inf"), ("--kl-loss-coef", "nan"),
                                             ("--clip-grad", "inf"), ("--eps-clip-high", "nan")])  # fmt: skip
def test_a_float_flag_must_be_finite(flag, value):
    # `inf` passed `gt=0` and `nan` passed every range check: T=inf sampled uniform noise, a NaN coefficient made the
    # loss NaN at the first step.
    with pytest.raises(ConfigError, match=rf"^{flag}: Input should be a finite number \(got {value}\)"):
        parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", flag, value])


def test_blake3_delta_checksum_without_the_package_is_refused_at_start(monkeypatch):
    # Without the check --dry-run said valid and the run stopped once the weight updater was built (Ray, engines up).
    real_find_spec = validation.importlib.util.find_spec
    monkeypatch.setattr(
        validation.importlib.util, "find_spec", lambda name: None if name == "blake3" else real_find_spec(name)
    )
    delta = {"rollout_engine": "reference", "weight_sync": "tensor", "update_weight_mode": "delta"}
    with pytest.raises(ConfigError, match=r"--update-weight-delta-checksum blake3 needs the blake3 package"):
        make(**delta, update_weight_delta_checksum="blake3")
    assert make(**delta, update_weight_delta_checksum="adler32").update_weight_delta_checksum == "adler32"
    # blake3 matters only to delta pushes: a full-mode run does not need the package.
    assert make(update_weight_delta_checksum="blake3").update_weight_mode == "full"


def test_eval_temperature_zero_is_greedy_eval_as_in_the_original():
    # The original's --eval-temperature is a bare float (0: SGLang samples greedily), and an --eval-config dataset's
    # `temperature: 0` was taken here; the flag was refused ("Input should be greater than 0"). Training keeps
    # refusing --rollout-temperature 0: its log-probs are taken at logits / T.
    assert make(eval_temperature=0.0).eval_temperature == 0.0
    with pytest.raises(ConfigError, match="--rollout-temperature: Input should be greater than 0"):
        make(rollout_temperature=0.0)


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ('{"continue_final_message": true}', "incompatible with the generation prompt the rollout always adds"),
        ('{"add_generation_prompt": false}', "always True: the prompt ends with the assistant's turn header"),
        ('{"tools": []}', "the row's --tool-key column"),
        ('{"tokenize": true}', "always False: prompts are rendered as text"),
    ],
)
def test_template_kwargs_the_rollout_passes_itself_are_refused_naming_the_flag(kwargs, why):
    # Each failed at the first row as "x.jsonl line 1: the chat template failed on this row: TypeError: ... got
    # multiple values for keyword argument 'tools'" (or continue_final_message's "not compatible"), blaming the data.
    key = kwargs.split('"')[1]
    with pytest.raises(ConfigError) as raised:
        parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--apply-chat-template-kwargs", kwargs])
    assert str(raised.value) == (
        f"--apply-chat-template-kwargs: {key!r} is an apply_chat_template argument the rollout sets itself ({why}); "
        "give only the template's own variables (e.g. enable_thinking)"
    )
    assert make(apply_chat_template_kwargs={"enable_thinking": False}).apply_chat_template_kwargs == {
        "enable_thinking": False
    }


@pytest.mark.parametrize("url", ["localhost:8000/score", "127.0.0.1:8000", "http:///score", "ftp://rm/score"])
def test_rm_url_must_be_an_http_url_with_a_host(url):
    # "localhost:8000/score" failed every request as an unsupported protocol, each retried with backoff for about
    # 150 s, before the rollout stopped.
    with pytest.raises(ConfigError) as raised:
        parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--rm-url", url])
    assert str(raised.value) == f"--rm-url {url!r}: not an http(s) URL with a host; write it as http://host:port/path"
    assert make(rm_url="http://localhost:8000/score").rm_url == "http://localhost:8000/score"


def test_a_custom_tis_function_without_use_tis_or_mismatch_metrics_is_refused():
    # The loss calls it only under --use-tis or --get-mismatch-metrics: alone, the user's weighting never ran and
    # nothing said so (the original's loss.py ignores it the same way).
    path = "slime_core.algorithms.tis.icepop_function"
    with pytest.raises(
        ConfigError, match=rf"^--custom-tis-function-path {re.escape(path)} is called only with --use-tis"
    ):
        make(custom_tis_function_path=path)
    assert make(custom_tis_function_path=path, use_tis=True).custom_tis_function_path == path
    assert make(custom_tis_function_path=path, get_mismatch_metrics=True).get_mismatch_metrics


def test_num_rollout_0_with_eval_interval_is_the_original_eval_only_run():
    # The original's train.py evaluates once when --num-rollout is 0 and --eval-interval is set (an eval of a trained
    # checkpoint, without --prompt-data); it was refused here: "--num-rollout: Input should be greater than or equal
    # to 1 (got 0)".
    args = make(num_rollout=0, eval_interval=1, eval_prompt_data=["aime", "aime.jsonl"])
    assert args.num_rollout == 0 and args.eval_interval == 1


def test_rm_type_is_stripped_as_the_original_reads_it():
    # Pass 48: the original's async_rm strips --rm-type; " math" from a launch script's quoting was refused here.
    assert make(rm_type=" math").rm_type == "math"
    assert make(rm_type="boxed_math\n").rm_type == "boxed_math"
    assert parse_args(["--rollout-batch-size", "4", "--num-rollout", "1", "--rm-type", " dapo "]).rm_type == "dapo"
    with pytest.raises(ConfigError, match=r"--rm-type ' ': empty"):
        make(rm_type=" ")
    with pytest.raises(ConfigError, match="unknown reward function 'maths'"):
        make(rm_type=" maths")

    # It evaluates whatever the start id (the loop's eval at rollout 0); a start below --num-rollout trains on.
    assert make(num_rollout=0, eval_interval=1, eval_prompt_data=["a", "a.jsonl"], start_rollout_id=5).num_rollout == 0
    assert make(num_rollout=3, start_rollout_id=2).start_rollout_id == 2


def test_the_liger_head_is_refused_where_its_first_log_prob_forward_would_fail(monkeypatch):
    # Both stopped the run at its first train step, after the engines and the first rollout (issue 27, pass 51).
    import importlib.util

    if importlib.util.find_spec("liger_kernel") is None:
        with pytest.raises(ConfigError, match=r"--log-probs-head liger needs the liger-kernel package"):
            make(train_backend="fsdp", log_probs_head="liger")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "liger_kernel" else real(name, *a)
    )
    assert make(train_backend="fsdp", log_probs_head="liger").log_probs_head == "liger"
    with pytest.raises(ConfigError, match=re.escape(
        "--log-probs-head liger with --rollout-top-p 0.5: liger computes the full softmax and cannot replay the "
        "engine's top-p sets; use --log-probs-head fused"
    )):  # fmt: skip
        make(train_backend="fsdp", log_probs_head="liger", rollout_top_p=0.5)
    assert make(train_backend="fsdp", log_probs_head="fused", rollout_top_p=0.5).rollout_top_p == 0.5


def test_lr_bounds_a_schedule_does_not_read_stay_accepted():
    # FSDP's constant schedule reads no --min-lr; FSDP warms up from --lr-warmup-init whatever its size.
    assert make(train_backend="fsdp", lr=1e-4, min_lr=1e-3).min_lr == 1e-3
    assert make(train_backend="fsdp", lr=1e-4, lr_warmup_iters=2, lr_warmup_init=1e-3).lr_warmup_init == 1e-3
    assert make(train_backend="megatron", lr=1e-4, lr_warmup_init=1e-3).lr_warmup_init == 1e-3  # no warmup


def test_a_negative_entropy_coef_is_accepted_as_in_the_original():
    # The original's --entropy-coef is any float (loss = pg_loss - entropy_coef * entropy): a negative one penalizes
    # entropy (entropy-minimization recipes). Here it was refused (ge=0); the loss math is in the parity test.
    assert make(entropy_coef=-0.01).entropy_coef == -0.01
