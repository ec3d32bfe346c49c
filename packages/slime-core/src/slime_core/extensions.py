"""The extension points: one `Registry` per kind, each entry a small frozen capability record.

| kind                | flag                    | entry-point group            | record                        |
|---------------------|-------------------------|------------------------------|-------------------------------|
| training backend    | `--train-backend`       | `slime.train_backends`       | `TrainBackendSpec`            |
| PPO critic backend  | `--train-backend`       | `slime.critic_backends`      | `Entry`                       |
| rollout engine      | `--rollout-engine`      | `slime.rollout_engines`      | `RolloutEngineSpec`           |
| reward function     | `--rm-type`             | `slime.rewards`              | `RewardSpec`                  |
| advantage estimator | `--advantage-estimator` | `slime.advantage_estimators` | `estimators.EstimatorSpec`    |
| weight transport    | `--weight-sync`         | `slime.weight_updaters`      | `Entry`                       |
| package checks      | (the flags it owns)     | `slime.preflight`            | `fn(cfg) -> list[Problem]`    |

The config checks each name against its registry when it is built, and code outside a provider asks the
record (`train_backend_spec(cfg).supports_lora`) instead of comparing names. The built-in fallbacks below name
the providers' own records (the rewards' are read from slime-rollout's `pyproject.toml`, `source_entry_points`);
they are used only where the providers' entry-point metadata is missing (a source checkout on `PYTHONPATH`).

Example:
    >>> TRAIN_BACKENDS.check_name("fsdp")
    >>> sorted(ROLLOUT_ENGINES.names())[:2]
    ['reference', 'sglang']
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Callable
from typing import Any

from slime_core.registry import Entry, Problem, Registry, resolve_path, source_entry_points

__all__ = [
    "CRITIC_BACKENDS",
    "PREFLIGHT_CHECKS",
    "REWARDS",
    "ROLLOUT_ENGINES",
    "TRAIN_BACKENDS",
    "WEIGHT_UPDATERS",
    "RewardSpec",
    "RolloutEngineSpec",
    "TrainBackendSpec",
    "engine_spec",
    "registered_names",
    "registry_for_group",
    "run_preflight_hooks",
    "train_backend_spec",
]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class TrainBackendSpec(Entry):
    """A training backend: `factory()` returns a `slime_core.protocols.TrainBackend`.

    Attributes:
        needs_gpu: cannot run without CUDA (preflight refuses a CPU-only machine).
        supports_colocate: can offload its state while the engines generate (`--colocate`).
        supports_cp: implements `--context-parallel-size` > 1.
        supports_lora: trains LoRA adapters (`--lora-rank`).
        supports_critic: has a PPO critic (a `slime.critic_backends` entry of the same name).
        megatron_native: runs megatron-core itself: reads `--tensor/--pipeline/--expert-model-parallel-size` from
            the Megatron flags (otherwise those sizes are 1) and the `megatron` column of
            `slime_core.config.megatron_flags.MEGATRON_FLAG_RULES` applies to it (otherwise the `fsdp` column:
            flags it translates, ignores or refuses).
        reads_torch_dist: loads Megatron `torch_dist` checkpoints (`--ref-load`) directly; otherwise a
            `torch_dist` reference is converted to HF first and an HF critic is built from its own config.json.
        checkpoint_format: the format of its `--save` directories (`"fsdp"`, `"torch_dist"`, ...), which
            `--load` must find.
        lr_decay_styles: the `--lr-decay-style` values it implements.
        optimizers: the `--optimizer` values it implements (validation refuses any other in one line).
        supports_fp16: trains in float16 with loss scaling (`--fp16`); otherwise `--fp16` is refused.
        supports_multimodal: trains vision-language models (`--multimodal-keys`, `--freeze-vision-tower`).
        supports_routing_replay: replays MoE routes (`--use-routing-replay`, `--use-rollout-routing-replay`).
        supports_true_on_policy: reproduces SGLang's log-probs bit for bit (`--true-on-policy-mode`).
        supports_opd_teacher: holds an on-policy-distillation teacher's weights (`--opd-teacher-load`) and scores
            the responses with them in the train step (`has_teacher`, `compute_log_probs(model="teacher")`), so
            `--opd-type` may name it (or the original's `megatron` with it); otherwise only `--opd-type sglang`.
    """

    needs_gpu: bool = True
    supports_colocate: bool = False
    supports_cp: bool = False
    supports_lora: bool = False
    supports_critic: bool = False
    megatron_native: bool = False
    reads_torch_dist: bool = False
    checkpoint_format: str = ""
    lr_decay_styles: tuple[str, ...] = ("constant", "linear", "cosine")
    optimizers: tuple[str, ...] = ("adam",)
    supports_fp16: bool = False
    supports_multimodal: bool = False
    supports_routing_replay: bool = False
    supports_true_on_policy: bool = False
    supports_opd_teacher: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RolloutEngineSpec(Entry):
    """An inference engine speaking SGLang's HTTP API (tests/fixtures/sglang-wire/README.md).

    Attributes:
        needs_gpu: cannot run without CUDA.
        supports_colocate: releases and resumes its accelerator memory (`--colocate`, `--offload-rollout`).
        launchable: slime starts its servers itself (`slime_rollout.engines.launch`; another package's record
            sets `factory` to a no-argument callable returning a `slime_rollout.engines.launch.common.EngineKind`);
            otherwise the run needs `--rollout-engine-urls` of servers started elsewhere.
        returns_routed_experts: answers `return_routed_experts` with `meta_info.routed_experts` when started with
            `--enable-return-routed-experts` (`--use-rollout-routing-replay`).
        applies_weight_deltas: serves `/update_weights_from_delta` (slime's endpoint, not SGLang's), which
            `--update-weight-mode delta --weight-sync tensor` needs; other engines take deltas over disk only.
        default_dtype: the dtype it holds the weights in without `--sglang-dtype` (a torch dtype name or "auto");
            the weight check casts what it pushed to it before hashing.
        auto_dtype_as_stored: its "auto" is the checkpoint's dtype as stored (transformers'); otherwise SGLang's
            rule (`configs/model_config.py:_get_and_verify_dtype`): a float32 checkpoint is served in float16
            (bfloat16 for Gemma).

    A GPU engine (`needs_gpu`) that is not colocated receives weights by NCCL broadcast under `--weight-sync auto`
    (`/init_weights_update_group`, `/update_weights_from_distributed`); a CPU engine reloads them from disk.
    """

    needs_gpu: bool = False
    supports_colocate: bool = False
    launchable: bool = False
    returns_routed_experts: bool = False
    applies_weight_deltas: bool = False
    default_dtype: str = "auto"
    auto_dtype_as_stored: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class RewardSpec(Entry):
    r"""A reward function (`--rm-type NAME`), in one of three forms; `slime_rollout.rewards.async_rm` calls it.

    - `factory`: `fn(args, sample) -> float | dict` (sync or async), called as a `--custom-rm-path` function.
    - `grader` (a built-in rule): `grade(response, label, metadata, boxed) -> float | dict`, called inline by
      `slime_rollout.rewards.rule_based_reward`; `boxed` tells it the type was `boxed_NAME`.
    - neither: a reward model behind `--rm-url` (`needs_url`): the reward is its JSON reply to
      `{"prompt", "response", "label"}` (`slime_rollout.rewards.remote`).

    Attributes:
        grader: the rule as an object or its import path `"module:attr"`; `metadata` is the sample's dict or None.
        pooled_grader: `async grade(response, label, metadata, boxed, *, num_workers, sample_index)`, the same
            rule with its expensive check in the `--rm-num-workers` process pool (`async_rm` prefers it).
        reads_box: under `boxed_NAME` the grader gets the whole response and reads the final `\boxed{}` itself;
            otherwise it gets that box's content ("" when there is none or the answer hedges between boxes).
        needs_url: calls a remote service at `--rm-url` (preflight refuses a run without it).
        grades_label: compares the response with the sample's label (preflight refuses null labels for it).
        label_in_metadata: a `metadata` key whose value stands in for the label (gpqa: `"correct_letter"`);
            preflight accepts a row without a label that has it. None: the label is the only answer.
        label_is_value: its label is one answer, text or a number (preflight refuses a dict or list label, which
            it would compare as its Python text); False for graders that take a list of references (f1).
    """

    grader: str | Callable[..., Any] | None = None
    pooled_grader: str | Callable[..., Any] | None = None
    reads_box: bool = False
    needs_url: bool = False
    grades_label: bool = False
    label_in_metadata: str | None = None
    label_is_value: bool = False

    def load_grader(self, *, pooled: bool = False) -> Callable[..., Any]:
        """The `grader` (or `pooled_grader`), imported on use when given as `"module:attr"`.

        Raises:
            ValueError: the record has no such grader.
            ImportError / AttributeError: the path does not resolve (the message names the entry).
        """
        which = "pooled_grader" if pooled else "grader"
        path = self.pooled_grader if pooled else self.grader
        if path is None:
            raise ValueError(f"--rm-type {self.name}: its record has no {which}")
        return resolve_path(path, what=f"--rm-type {self.name} {which}")


TRAIN_BACKENDS: Registry[TrainBackendSpec] = Registry(
    "slime.train_backends",
    flag="--train-backend",
    kind="train backend",
    entry_type=TrainBackendSpec,
    builtins={"fsdp": "slime_train_fsdp.spec:FSDP", "megatron": "slime_train_megatron.spec:MEGATRON"},
)

#: The PPO critic of `--train-backend NAME`: `factory()` returns a `slime_core.protocols.CriticBackend`.
CRITIC_BACKENDS: Registry[Entry] = Registry(
    "slime.critic_backends",
    flag="--train-backend",
    kind="critic backend",
    entry_type=Entry,
    builtins={"fsdp": "slime_train_fsdp:FSDPCriticBackend", "megatron": "slime_train_megatron:MegatronCriticBackend"},
)

ROLLOUT_ENGINES: Registry[RolloutEngineSpec] = Registry(
    "slime.rollout_engines",
    flag="--rollout-engine",
    kind="rollout engine",
    entry_type=RolloutEngineSpec,
    builtins={"sglang": "slime_rollout.entries:SGLANG", "reference": "slime_rollout.entries:REFERENCE"},
)

REWARDS: Registry[RewardSpec] = Registry(
    "slime.rewards",
    flag="--rm-type",
    kind="reward function",
    entry_type=RewardSpec,
    # slime-rollout's graders, as its pyproject.toml declares them (read, not imported: a source checkout).
    builtins=source_entry_points("slime_rollout", "slime.rewards"),
)

#: `--weight-sync` (after validation resolved `auto`): `factory(cfg, client)` returns an object with
#: `update(buckets, weight_version)`; `client` is a `slime_rollout.engines.client.RolloutClient` of the engines.
#: `distributed` is the app's (it needs the trainer's node address), named here as the backends are: by import path.
WEIGHT_UPDATERS: Registry[Entry] = Registry(
    "slime.weight_updaters",
    flag="--weight-sync",
    kind="transport",
    entry_type=Entry,
    builtins={
        "tensor": "slime_rollout.weight_sync.updaters:TensorWeightUpdater",
        "disk": "slime_rollout.weight_sync.updaters:DiskWeightUpdater",
        "distributed": "slime_app.weights:distributed_weight_updater",
        "lora": "slime_rollout.weight_sync.lora:LoraWeightUpdater",
    },
)


#: Each package's pre-launch checks of the flags it owns: `factory` is `fn(cfg) -> list[Problem]`; the app's
#: preflight runs every installed one (`run_preflight_hooks`).
PREFLIGHT_CHECKS: Registry[Entry] = Registry(
    "slime.preflight",
    flag="preflight",
    kind="package check",
    entry_type=Entry,
    builtins={"slime-rollout": "slime_rollout.preflight:check"},
)


def registry_for_group(group: str) -> Any:
    """The registry of entry-point group `group` (`"slime.train_backends"`, ...), for the CLI's help.

    Raises:
        KeyError: no registry has that group.
    """
    from slime_core.estimators import ESTIMATORS  # estimators imports nothing of this module

    registries = {r.group: r for r in (TRAIN_BACKENDS, CRITIC_BACKENDS, ROLLOUT_ENGINES, REWARDS, WEIGHT_UPDATERS)}
    registries[ESTIMATORS.group] = ESTIMATORS
    return registries[group]


def registered_names(group: str) -> list[str]:
    """The names entry-point group `group` offers, for the CLI's help; imports no provider.

    A group with a registry here (`registry_for_group`) answers from it; another one (`slime.envs`, whose registry is
    slime-envs') from the installed distributions' entry points.
    """
    try:
        return list(registry_for_group(group).names())
    except KeyError:
        return sorted({ep.name for ep in importlib.metadata.entry_points(group=group)})


def train_backend_spec(cfg: Any) -> TrainBackendSpec:
    """The capability record of `cfg.train_backend`.

    Raises:
        UnknownNameError: not registered.
        ImportError: its provider is not installed here (the message names the entry).
    """
    return TRAIN_BACKENDS.get(cfg.train_backend)


def engine_spec(cfg: Any) -> RolloutEngineSpec:
    """The capability record of `cfg.rollout_engine` (resolved by validation: never None on a validated config).

    Raises:
        UnknownNameError: not registered.
    """
    return ROLLOUT_ENGINES.get(cfg.rollout_engine)


def run_preflight_hooks(cfg: Any) -> list[Problem]:
    """Runs the installed packages' checks, then those of the entries the config selects; collects the problems.

    Package checks are `PREFLIGHT_CHECKS`; the selected entries are the backend, engine, reward and estimator.

    Args:
        cfg: the validated config.

    Returns:
        Every problem found, in that order. A package's messages name their flags themselves; an entry's are
        prefixed with its selection (`"--train-backend megatron: ..."`).

    Raises:
        TypeError: a check returned something other than a list of `Problem`.
    """
    from slime_core.estimators import ESTIMATORS

    problems: list[Problem] = []
    for name in PREFLIGHT_CHECKS.names():
        problems += Entry(name=name, preflight=PREFLIGHT_CHECKS.get(name).load()).check(cfg)
    owned: list[tuple[str, Callable[[Any], list[Problem]]]] = []
    owned.append((f"--train-backend {cfg.train_backend}", train_backend_spec(cfg).check))
    if cfg.rollout_engine:
        owned.append((f"--rollout-engine {cfg.rollout_engine}", engine_spec(cfg).check))
    if cfg.rm_type and not cfg.custom_rm_path:
        owned.append((f"--rm-type {cfg.rm_type}", REWARDS.get(cfg.rm_type.removeprefix("boxed_")).check))
    spec = ESTIMATORS.get(cfg.advantage_estimator)
    owned.append((f"--advantage-estimator {spec.name}", spec.preflight_problems))
    for owner, fn in owned:
        problems += [dataclasses.replace(p, message=f"{owner}: {p.message}") for p in fn(cfg)]
    return problems
