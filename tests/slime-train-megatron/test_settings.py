import pytest

from slime_core.config import SlimeArgs
from slime_train_megatron.settings import MegatronSettings

# A real, validated run config; tests set fields with model_copy (no re-validation, so bad Megatron tokens
# reach the settings' own parser).
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def test_defaults_follow_slime():
    s = MegatronSettings.from_config(_CONFIG)
    assert s.bf16 and not s.fp16 and s.use_distributed_optimizer and s.tensor_model_parallel_size == 1
    assert s.params_dtype_name == "bfloat16"


def test_tokens_override_config_fields():
    args = _CONFIG.model_copy(
        update=dict(
            lr=3e-6,
            lr_warmup_iters=1,
            megatron_args=["--tensor-model-parallel-size", "2", "--sequence-parallel", "--fp16", "--lr-warmup-iters",
                           "5", "--no-use-distributed-optimizer", "--attention-softmax-in-fp32"],
        )
    )  # fmt: skip
    s = MegatronSettings.from_config(args)
    assert s.tensor_model_parallel_size == 2 and s.sequence_parallel and s.fp16 and not s.bf16
    assert s.lr == 3e-6 and s.lr_warmup_iters == 5 and not s.use_distributed_optimizer
    assert s.attention_softmax_in_fp32


def test_every_flag_the_table_marks_read_is_a_settings_field():
    from slime_core.config.megatron_flags import MEGATRON_FLAG_RULES

    read = {flag for flag, rule in MEGATRON_FLAG_RULES.items() if rule.megatron == "read"}
    fields = {"--" + name.replace("_", "-") for name in MegatronSettings.model_fields}
    switches = {"--no-" + name.replace("_", "-") for name, f in MegatronSettings.model_fields.items()
                if f.annotation in (bool, bool | None) and f.default is not False}  # fmt: skip
    assert read - fields - switches == set()


def test_the_optimizer_speed_switches_are_on_by_default_and_their_no_forms_reach_the_settings():
    """megatron-core's fallbacks without TE/Apex run fused (as it does with them) unless the `--no-` form is given;
    the top-level parser passes the `--no-` forms to Megatron and refuses them for FSDP (which cannot honour them)."""
    from slime_core.config import parse_args
    from slime_core.config.base import ConfigError

    s = MegatronSettings.from_config(_CONFIG)
    assert s.use_torch_fused_adam and s.use_foreach_grad_norm and s.use_distributed_optimizer
    off = ["--no-use-torch-fused-adam", "--no-use-foreach-grad-norm", "--no-use-distributed-optimizer"]
    s = MegatronSettings.from_config(_CONFIG.model_copy(update={"megatron_args": off}))
    assert not (s.use_torch_fused_adam or s.use_foreach_grad_norm or s.use_distributed_optimizer)
    args = parse_args(["--train-backend", "megatron", "--rollout-batch-size", "1", "--num-rollout", "1", *off])
    assert args.megatron_args == off
    with pytest.raises(ConfigError, match="--no-use-torch-fused-adam.*always torch's fused kernel"):
        parse_args(["--train-backend", "fsdp", "--rollout-batch-size", "1", "--num-rollout", "1",
                    "--no-use-torch-fused-adam"])  # fmt: skip


@pytest.mark.parametrize(("tokens", "cuda", "te", "moe", "compiled"), [
    ([], True, False, False, True),  # the measured default: CUDA, local spec, dense, TP = CP = 1
    ([], False, False, False, False),  # CPU: compiling costs minutes
    ([], True, True, False, False),  # Transformer Engine's layers
    ([], True, False, True, False),  # experts
    (["--tensor-model-parallel-size", "2"], True, False, False, False),
    (["--context-parallel-size", "2"], True, False, False, False),
    (["--no-megatron-compile-layers"], True, False, False, False),
    (["--megatron-compile-layers"], False, True, True, True),  # asked for: compiled wherever it runs
    (["--megatron-compile-layers", "--no-megatron-compile-layers"], True, False, False, False),  # the last wins
    (["--attention-backend", "local"], True, False, False, False),  # the dense-mask attention
    (["--attention-backend", "flash"], True, False, False, True),
    (["--attention-backend", "local", "--megatron-compile-layers"], True, False, False, True),
])  # fmt: skip
def test_layers_compile_by_default_only_where_it_was_measured_to_pay(tokens, cuda, te, moe, compiled):
    from slime_train_megatron.settings import attention_kind, compiles_layers

    s = MegatronSettings.from_config(_CONFIG.model_copy(update={"megatron_args": tokens}))
    dense = s.attention_backend == "local" and attention_kind(s, transformer_engine=False) == "dense"
    assert compiles_layers(s, cuda=cuda, transformer_engine=te, moe=moe, dense_attention=dense) is compiled


def test_the_original_scripts_megatron_flags_reach_the_settings():
    # Flags of run-qwen3-30B-A3B.sh / run-qwen3-235B-A22B.sh (validated config: only the `read` ones are parsed).
    from slime_core.config import parse_args

    args = parse_args([
        "--rollout-batch-size", "1", "--num-rollout", "1", "--tensor-model-parallel-size", "4", "--sequence-parallel",
        "--expert-model-parallel-size", "8", "--decoder-last-pipeline-num-layers", "22", "--optimizer-cpu-offload",
        "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer", "--moe-router-dtype", "fp32",
        "--moe-aux-loss-coeff", "0", "--moe-token-drop-policy", "probs", "--moe-permute-fusion",
        "--attention-backend", "flash", "--attention-softmax-in-fp32", "--accumulate-allreduce-grads-in-fp32",
        "--num-layers", "48", "--no-rope-fusion", "--recompute-granularity", "full",
    ])  # fmt: skip
    s = MegatronSettings.from_config(args)
    assert (s.tensor_model_parallel_size, s.expert_model_parallel_size, s.sequence_parallel) == (4, 8, True)
    assert s.decoder_last_pipeline_num_layers == 22 and s.recompute_granularity == "full"
    assert s.optimizer_cpu_offload and s.overlap_cpu_optimizer_d2h_h2d and s.use_precision_aware_optimizer
    assert (s.moe_router_dtype, s.moe_aux_loss_coeff, s.moe_token_drop_policy) == ("fp32", 0.0, "probs")
    assert s.moe_permute_fusion and s.attention_backend == "flash" and s.attention_softmax_in_fp32


@pytest.mark.parametrize(
    ("tokens", "match"),
    [
        (
            ["--tensor-model-parallel-size", "two"],
            "^invalid Megatron settings: --tensor-model-parallel-size two:",
        ),
        (["--fp16", "--fp32"], "mutually exclusive"),
        (["--expert-tensor-parallel-size", "2"], "expert-tensor-parallel"),
        (["--lr-decay-style", "exp"], "^invalid Megatron settings: --lr-decay-style exp: Input should be 'constant'"),
        (["--tensor-model-parallel-size"], "megatron-args"),
        # MoE: refused here instead of megatron-core's assert in the first forward (Sinkhorn with config.json's
        # router_aux_loss_coef), or at model build (flex over one expert rank; DeepEP or padding without their
        # prerequisite); Sinkhorn with coefficient 0 ran, but its training routes differ from HF's (log-probs 0.05
        # apart on the tiny Qwen3-MoE of test_moe_cpu.py).
        (
            ["--moe-router-load-balancing-type", "sinkhorn"],
            "^invalid Megatron settings: --moe-router-load-balancing-type sinkhorn is not",
        ),
        (
            ["--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0"],
            "^invalid Megatron settings: --moe-router-load-bal",
        ),
        (
            ["--moe-token-dispatcher-type", "flex", "--moe-enable-deepep"],
            "^invalid Megatron settings: --moe-token-dispatcher-type flex needs --expert-model-parallel-size > 1",
        ),
        (
            ["--moe-enable-deepep", "--expert-model-parallel-size", "2"],
            "^invalid Megatron settings: --moe-enable-deepep needs --moe-token-dispatcher-type flex "
            "\\(got alltoall\\)$",
        ),
        (
            ["--moe-pad-expert-input-to-capacity"],
            "^invalid Megatron settings: --moe-pad-expert-input-to-capacity needs --moe-expert-capacity",
        ),
    ],
)
def test_bad_values_raise_value_error(tokens, match):
    with pytest.raises(ValueError, match=match):
        MegatronSettings.from_config(_CONFIG.model_copy(update={"megatron_args": tokens}))


def test_moe_settings_without_effect_or_that_part_trainer_and_engine_are_logged(caplog):
    tokens = ["--moe-token-drop-policy", "position", "--moe-token-dispatcher-type", "flex", "--moe-enable-deepep",
              "--expert-model-parallel-size", "2"]  # fmt: skip
    with caplog.at_level("WARNING", logger="slime_train_megatron.settings"):
        s = MegatronSettings.from_config(_CONFIG.model_copy(update={"megatron_args": tokens}))
    assert (s.moe_token_drop_policy, s.moe_token_dispatcher_type, s.moe_enable_deepep) == ("position", "flex", True)
    assert [r.getMessage() for r in caplog.records] == [
        "--moe-token-drop-policy position has no effect without --moe-expert-capacity-factor (no token is dropped)"
    ]
    caplog.clear()
    with caplog.at_level("WARNING", logger="slime_train_megatron.settings"):
        s = MegatronSettings.from_config(
            _CONFIG.model_copy(update={"megatron_args": ["--moe-expert-capacity-factor", "1.5"]})
        )
    assert s.moe_expert_capacity_factor == 1.5
    assert [r.getMessage() for r in caplog.records] == [
        "--moe-expert-capacity-factor 1.5: the trainer drops the tokens over an expert's capacity, the rollout engine "
        "drops none; their log-probs differ on those tokens"
    ]


def test_sequence_parallel_without_tp_is_disabled():
    s = MegatronSettings.from_config(_CONFIG.model_copy(update={"megatron_args": ["--sequence-parallel"]}))
    assert not s.sequence_parallel


def test_world_layout():
    s = MegatronSettings(tensor_model_parallel_size=2, pipeline_model_parallel_size=2, expert_model_parallel_size=2)
    assert s.world_layout(8).data_parallel_size == 2
    with pytest.raises(ValueError, match="not divisible"):
        s.world_layout(6)


def test_experts_fold_over_the_ranks_as_in_megatron_core():
    # The original's qwen3-30B-A3B and multi-agent scripts: TP 4, EP 8 on 8 GPUs (DP 2). megatron-core folds the
    # experts over a stage's ranks (world % EP×ETP×PP == 0); the old rule "DP×CP divisible by EP" refused it.
    s = MegatronSettings(tensor_model_parallel_size=4, expert_model_parallel_size=8, sequence_parallel=True)
    assert s.world_layout(8).data_parallel_size == 2
    with pytest.raises(ValueError, match=r"^world size 8 is not divisible by EP×ETP×PP = 8×1×2$"):
        MegatronSettings(expert_model_parallel_size=8, pipeline_model_parallel_size=2).world_layout(8)


def test_parallel_state_gets_the_expert_tensor_parallel_size():
    # Left out, megatron-core's initialize_model_parallel makes ETP the TP size: the experts were sharded over TP
    # (against --expert-tensor-parallel-size 1, which every original MoE script passes, and the model config's 1),
    # and TP 4 × EP 8 needed 32 ranks.
    s = MegatronSettings(tensor_model_parallel_size=4, expert_model_parallel_size=8, context_parallel_size=1)
    assert s.parallel_state_kwargs() == {
        "tensor_model_parallel_size": 4,
        "pipeline_model_parallel_size": 1,
        "context_parallel_size": 1,
        "expert_model_parallel_size": 8,
        "expert_tensor_parallel_size": 1,
    }


# That megatron-core builds TP 2 × EP 2 on two ranks from `parallel_state_kwargs` (ETP 1 × EP 2), and needed 4 ranks
# without `expert_tensor_parallel_size`, is checked by test_moe_cpu.py's
# `test_expert_parallel_two_ranks_export_logits_and_torch_dist`, on the two ranks it spawns anyway (this file's
# `test_megatron_core_builds_tp2_ep2_on_two_ranks_from_these_kwargs` paid a spawn of its own for it).


@pytest.mark.parametrize(
    ("sizes", "world", "dp"),
    [
        (dict(tensor_model_parallel_size=4, expert_model_parallel_size=8), 8, 2),  # run-qwen3-30B-A3B.sh
        (dict(tensor_model_parallel_size=4, expert_model_parallel_size=8), 16, 4),  # run-moonlight-16B-A3B on 2 nodes
        (dict(tensor_model_parallel_size=4, pipeline_model_parallel_size=4, context_parallel_size=2,
              expert_model_parallel_size=16), 64, 2),  # run-qwen3-235B-A22B.sh
    ],
)  # fmt: skip
def test_expert_parallelism_wider_than_dp_is_megatron_cores_layout(sizes, world, dp):
    # Issue 27, hostile pass 31: world_layout required EP to divide DP×CP (megatron-core before MoE parallel folding),
    # so the original's MoE scripts (EP 8 with TP 4 on 8 GPUs: DP 2) were refused before the model was built.
    # megatron-core lays the expert layers out over EP×ETP×PP ranks (parallel_state.initialize_model_parallel).
    assert MegatronSettings(**sizes).world_layout(world).data_parallel_size == dp


def test_expert_parallelism_that_does_not_divide_the_ranks_of_a_stage_is_refused():
    s = MegatronSettings(pipeline_model_parallel_size=2, expert_model_parallel_size=3)
    with pytest.raises(ValueError) as e:
        s.world_layout(4)
    assert str(e.value) == "world size 4 is not divisible by EP×ETP×PP = 3×1×2"


@pytest.mark.parametrize(
    ("tokens", "experts", "named"),
    [
        (["--pipeline-model-parallel-size", "2"], None, "num_hidden_layers 3 is not divisible by 2"),
        (
            ["--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "3"],
            None,
            "and num_hidden_layers 3: no layers are left for the other 1 stage(s)",
        ),
        (["--decoder-last-pipeline-num-layers", "3"], None, "needs --pipeline-model-parallel-size > 1"),
        (["--expert-model-parallel-size", "3"], 4, "--expert-model-parallel-size 3: 4 experts are not divisible by 3"),
    ],
)
def test_a_layout_the_model_does_not_split_over_is_refused_before_megatron_builds_it(tokens, experts, named):
    # Issue 27, hostile pass 31: the backend went on to megatron-core, whose model build stopped each rank with a bare
    # assert ("num_layers should be divisible by pipeline_model_parallel_size", "num_moe_experts % ep_size == 0").
    # The check comes first in build_parallel_model: no process group is needed to be told.
    import types

    from slime_train_megatron.trainer_parts import build_parallel_model

    cfg = _CONFIG.model_copy(update={"megatron_args": tokens})
    model_args = types.SimpleNamespace(num_layers=3, num_experts=experts)
    with pytest.raises(ValueError, match="the Megatron layout does not fit the model: ") as e:
        build_parallel_model(cfg, MegatronSettings.from_config(cfg), model_args)
    assert named in str(e.value)


def test_the_original_scripts_pipeline_layouts_fit_their_models():
    from slime_core.config.layer_split import layer_split_problems

    # (layers, experts, PP, first, last, EP) of the original's run-deepseek-r1, glm4.7-30B-A3B, glm5.2, kimi-k2,
    # qwen3-235B-A22B, qwen3-next-80B-A3B, qwen3.5-27B scripts (tests/fixtures/original-scripts).
    for layers, experts, pp, first, last, ep in [
        (61, 256, 4, None, 13, 32), (47, 64, 2, None, 23, 8), (78, 256, 8, 14, 16, 32), (61, 384, 8, None, 5, 32),
        (94, 128, 4, None, 22, 16), (48, 512, 4, None, 9, 8), (64, None, 2, None, 30, 1), (62, 256, 2, None, None, 4),
    ]:  # fmt: skip
        assert layer_split_problems(layers, experts, pipeline=pp, first=first, last=last, expert=ep) == []
    assert layer_split_problems(61, 256, pipeline=4, last=14, expert=32) == [
        "--decoder-last-pipeline-num-layers 14 with --pipeline-model-parallel-size 4 and num_hidden_layers 61: the "
        "other 47 layers do not split evenly over the other 3 stage(s)"
    ]
    assert layer_split_problems(4, None, pipeline=2, first=2, last=3) == [
        "--decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 3 with "
        "--pipeline-model-parallel-size 2 and num_hidden_layers 4: the stages hold 5 layers, not 4"
    ]
