"""`SlimeArgs`: the whole run config as one flat, validated pydantic model.

Example:
    >>> args = SlimeArgs.from_dict({"rollout_batch_size": 4, "n_samples_per_prompt": 2, "num_rollout": 3})
    >>> args.global_batch_size, args.num_steps_per_rollout
    (8, 1)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from typing import Any, Self

import yaml
from pydantic import ConfigDict, ValidationError, model_validator

from slime_core.config.base import ConfigError, arg, field_to_flag
from slime_core.config.cluster import ClusterArgs, EngineArgs, WeightSyncArgs
from slime_core.config.mismatch import MismatchArgs
from slime_core.config.monitoring import DebugArgs, EvalArgs, HealthArgs, LoggingArgs
from slime_core.config.rollout import DataArgs, MultiTurnArgs, RewardArgs, RolloutArgs, SamplingArgs
from slime_core.config.sglang_flags import sglang_flag_value
from slime_core.config.training import AlgorithmArgs, CheckpointArgs, FsdpArgs, LoraArgs, OptimizerArgs
from slime_core.config.validation import derive_and_validate
from slime_core.estimators import get_estimator
from slime_core.secrets import redact_mapping

__all__ = ["PluginArgs", "SlimeArgs", "config_error_from_validation", "plugin_view"]


class SlimeArgs(
    # Listed from last to first concern: pydantic orders fields from the last base to the first, and
    # that order is the one of `to_dict()`, `to_yaml()` and `--help`.
    HealthArgs,
    DebugArgs,
    LoggingArgs,
    EvalArgs,
    CheckpointArgs,
    LoraArgs,
    FsdpArgs,
    OptimizerArgs,
    MismatchArgs,
    AlgorithmArgs,
    MultiTurnArgs,
    RewardArgs,
    DataArgs,
    SamplingArgs,
    RolloutArgs,
    WeightSyncArgs,
    EngineArgs,
    ClusterArgs,
):
    """The run config: every group's fields as flat attributes (`args.rollout_batch_size`).

    Build it with `slime_core.config.parse_args(argv)` (command line / YAML) or `SlimeArgs.from_dict(d)`.
    Validation fills derived defaults (`global_batch_size`, `num_steps_per_rollout`,
    `over_sampling_batch_size`, offload flags, `rollout_engine`, `weight_sync`, ...), so a
    validated instance holds only concrete values and survives `to_dict()` / `from_dict()`.

    A validated instance is frozen: assigning a field raises `pydantic.ValidationError`. Run-time facts
    (engine URLs, router address) travel as values; user plugins get a `PluginArgs` view built from the
    config and those values (`PluginArgs.from_config`).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    megatron_args: list[str] = arg(
        [], "Raw Megatron-LM command-line tokens collected by parse_args (for the Megatron backend).", cli=False
    )

    @model_validator(mode="after")
    def _derive_and_validate(self) -> Self:
        derive_and_validate(self)
        return self

    @property
    def with_ref(self) -> bool:
        """Whether a reference model is needed (KL in the reward or in the loss, or the estimator needs one)."""
        return self.kl_coef != 0 or self.use_kl_loss or get_estimator(self.advantage_estimator).needs_ref

    @property
    def use_critic(self) -> bool:
        """Whether a value model is trained (the estimator's spec says it needs a critic: PPO)."""
        return get_estimator(self.advantage_estimator).needs_critic

    @property
    def eval_datasets(self) -> list[tuple[str, str]]:
        """`--eval-prompt-data name path ...` as `[(name, path), ...]` (empty when unset)."""
        data = self.eval_prompt_data or []
        return list(zip(data[0::2], data[1::2], strict=True))

    # The original's argparse stores its five `--disable-*` switches under the positive name (`dest=`, `store_false`):
    # its plugins read `args.rollout_global_dataset` (the first line of its `generate_rollout[_async]`, which custom
    # rollout functions are copied from), `args.rewards_normalization` and `args.grpo_std_normalization` (its reward
    # post-processing), ... Here the field is the flag's own name; these read it under the original's.

    @property
    def rollout_global_dataset(self) -> bool:
        """The original's name of `not --disable-rollout-global-dataset`."""
        return not self.disable_rollout_global_dataset

    @property
    def compute_advantages_and_returns(self) -> bool:
        """The original's name of `not --disable-compute-advantages-and-returns`."""
        return not self.disable_compute_advantages_and_returns

    @property
    def grpo_std_normalization(self) -> bool:
        """The original's name of `not --disable-grpo-std-normalization`."""
        return not self.disable_grpo_std_normalization

    @property
    def rewards_normalization(self) -> bool:
        """The original's name of `not --disable-rewards-normalization`."""
        return not self.disable_rewards_normalization

    @property
    def wandb_random_suffix(self) -> bool:
        """The original's name of `not --disable-wandb-random-suffix`."""
        return not self.disable_wandb_random_suffix

    def megatron_flag(self, flag: str, default: Any = None) -> Any:
        """The value of a pass-through Megatron flag from `megatron_args`.

        Args:
            flag: e.g. `--tensor-model-parallel-size`.
            default: Returned when the flag is absent.

        Returns:
            True for a flag given without value, the single value string, a list of strings for several
            values, or `default`. The last occurrence wins, as in argparse.
        """
        tokens, found = self.megatron_args, default
        for i, token in enumerate(tokens):
            name, eq, inline = token.partition("=")
            if name != flag:
                continue
            if eq:
                found = inline
                continue
            values = []
            for value in tokens[i + 1 :]:
                if value.startswith("--"):
                    break
                values.append(value)
            found = True if not values else values[0] if len(values) == 1 else values
        return found

    def _parallel_size(self, flag: str, default: int = 1) -> int:
        value = self.megatron_flag(flag, default)
        try:
            size = int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{flag}: expected an integer, got {value!r}") from None
        if size < 1:  # 0 divided the dry run's layout arithmetic by zero
            raise ConfigError(f"{flag}: expected an integer >= 1, got {value!r}")
        return size

    @property
    def make_vocab_size_divisible_by(self) -> int:
        """`--make-vocab-size-divisible-by`, Megatron's default 128 when absent.

        The vocabulary padding of Megatron models and torch_dist checkpoints (`slime_convert.model_args`); FSDP
        never pads, and reads it only to recognise a torch_dist `--ref-load`'s padding.
        """
        return self._parallel_size("--make-vocab-size-divisible-by", 128)

    @property
    def check_for_nan_in_loss_and_grad(self) -> bool:
        """Megatron-LM's switch, on unless `--no-check-for-nan-in-loss-and-grad` is given; both backends read it.

        On, a non-finite gradient stops the run before it reaches the weights (Megatron-LM's gradient check); off, an
        optimizer step whose gradient norm is not finite is skipped (the original's `train_step`).
        """
        return self.megatron_flag("--no-check-for-nan-in-loss-and-grad", False) is False

    @property
    def _megatron_native(self) -> bool:
        """Whether the backend reads TP/PP/EP from the Megatron flags (its capability record says)."""
        from slime_core.extensions import train_backend_spec  # extensions imports no config module

        return train_backend_spec(self).megatron_native

    @property
    def tensor_model_parallel_size(self) -> int:
        """Megatron TP size from `--tensor-model-parallel-size` (1 when absent or the backend does not read it)."""
        return self._parallel_size("--tensor-model-parallel-size") if self._megatron_native else 1

    @property
    def pipeline_model_parallel_size(self) -> int:
        """Megatron PP size from `--pipeline-model-parallel-size` (1 when absent or the backend does not read it)."""
        return self._parallel_size("--pipeline-model-parallel-size") if self._megatron_native else 1

    @property
    def context_parallel_size(self) -> int:
        """CP size from `--context-parallel-size` (1 when absent): Megatron's, or FSDP's Ulysses all-to-all."""
        return self._parallel_size("--context-parallel-size")

    @property
    def expert_model_parallel_size(self) -> int:
        """Megatron EP size from `--expert-model-parallel-size` (1 when absent or the backend does not read it)."""
        return self._parallel_size("--expert-model-parallel-size") if self._megatron_native else 1

    def to_dict(self) -> dict[str, Any]:
        """All fields as JSON-compatible values (for Ray transport and saving next to checkpoints)."""
        return self.model_dump(mode="json")

    def to_public_dict(self) -> dict[str, Any]:
        """`to_dict()` with every set credential replaced by `"REDACTED"` (`slime_core.secrets`).

        `--wandb-key`, and pass-through `...api-key` flags in `sglang_args` / `router_args`. For what leaves the
        process or reaches a log: the W&B run config (the original uploaded the API key there with the rest of
        `args`, readable by everyone with access to the project) and the `--dry-run` listing.
        """
        out = redact_mapping(self.to_dict())
        for key in ("sglang_args", "router_args"):
            out[key] = redact_mapping(out[key])
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SlimeArgs:
        """Validates a dict of field values (underscored names) into `SlimeArgs`.

        Raises:
            ConfigError: A value is invalid or a key is unknown; the message names the flag.
        """
        try:
            return cls.model_validate(dict(data))
        except ValidationError as e:
            raise config_error_from_validation(e) from None

    def to_yaml(self, path: str | os.PathLike[str]) -> None:
        """Writes `to_dict()` as YAML atomically (temp file in the same directory, then rename)."""
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".args-", suffix=".yaml.tmp")
        try:
            with os.fdopen(fd, "w") as f:
                yaml.safe_dump(self.to_dict(), f, sort_keys=False)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


class PluginArgs(SlimeArgs):
    """What user plugins receive as `args`: the run config plus the run's engine addresses, writable.

    Original slime plugins (`custom_rm(args, sample)`, `generate(args, sample, sampling_params)`, data
    sources, filters, rollout functions) read `args.<flag>` and, for custom generate functions,
    `args.sglang_router_ip` / `args.sglang_router_port` / `args.rollout_engine_urls`, which only exist
    once the engines run. This is the one place where run-time facts meet the config: built once by the
    component that owns the engines, from the frozen `SlimeArgs` and explicit values. Plugins may set
    extra attributes on it (the original passes a mutable namespace); the config itself never changes.
    """

    model_config = ConfigDict(extra="allow", frozen=False)

    def __getattr__(self, name: str) -> Any:
        """Extra attributes, then the original's `args.sglang_<field>` of a given `--sglang-<field>` flag.

        The original's plugins read the engine flags as attributes (`getattr(args, "sglang_tool_call_parser", None)`
        in its coding-agent example, `args.sglang_dp_size`); with no such attribute here the default was taken
        silently although the flag was given. A flag not given stays absent (AttributeError, so `getattr`'s default
        applies): SGLang's own defaults are not known here.
        """
        try:
            return super().__getattr__(name)  # type: ignore[misc]  # pydantic's: private and extra attributes
        except AttributeError:
            # From the instance's dict: a half-built instance (copy, unpickling) has no fields yet, and reading
            # `self.sglang_args` there would come back here.
            flags = self.__dict__.get("sglang_args")
            if name.startswith("sglang_") and flags:
                try:
                    return sglang_flag_value(flags, name.removeprefix("sglang_"))
                except KeyError:
                    pass
            raise

    @classmethod
    def from_config(
        cls,
        config: SlimeArgs,
        *,
        engine_urls: list[str] | None = None,
        router_url: str | None = None,
    ) -> PluginArgs:
        """The plugin view of `config` with the run's engine addresses.

        Args:
            config: the validated run config.
            engine_urls: base URLs of the engines (`http://host:port`); None keeps `--rollout-engine-urls`.
            router_url: `http://host:port` of the router the rollout talks to, or of the only engine when
                there is no router; None keeps `--sglang-router-ip` / `--sglang-router-port`.

        Returns:
            A `PluginArgs` sharing the config's (immutable) values; not re-validated. Keys of
            `--custom-config-path` that are not flags (`config.custom_config`) are attributes too, as the
            original's `setattr(args, key, value)` makes them (e.g. `args.rollout_interaction_env_path` of its
            geo3k multi-turn example); `args.custom_config` keeps them as a dict.

        Raises:
            ValueError: `router_url` is not of the form `http://host:port`.
        """
        values = {name: getattr(config, name) for name in type(config).model_fields}
        # cli.parse_args puts only keys that are not fields there; a field is never shadowed.
        values.update({k: v for k, v in config.custom_config.items() if k not in values})
        # The original's parser defaults, which plugins read: `--rollout-sample-hook-path` appends to `[]`, and an
        # unset `--eval-function-path` is the rollout function's path (slime/utils/arguments.py).
        values["rollout_sample_hook_path"] = list(config.rollout_sample_hook_path or [])
        if config.eval_function_path is None:
            values["eval_function_path"] = config.rollout_function_path
        if engine_urls is not None:
            values["rollout_engine_urls"] = list(engine_urls)
        if router_url is not None:
            host, sep, port = router_url.split("://", 1)[-1].rstrip("/").rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"router_url must be http://host:port, got {router_url!r}")
            values["sglang_router_ip"], values["sglang_router_port"] = host, int(port)
        return cls.model_construct(**values)


# The views `plugin_view` handed out, newest last, each with the config it was built from (held, so its id is not
# reused by another config while the entry lives). A handful: a process trains with one config (tests build many).
_VIEWS: dict[int, tuple[SlimeArgs, PluginArgs]] = {}
_MAX_VIEWS = 8


def plugin_view(config: SlimeArgs) -> SlimeArgs:
    """What a trainer-side hook gets as `args`: one writable `PluginArgs` view of `config`, the same at every call.

    As the original's one mutable `args` namespace: the `--custom-config-path` keys that are not flags are attributes,
    and an attribute a hook sets (`args.my_cache = ...`) is there at its next call. The frozen config refused the
    assignment ("Instance is frozen"), and a view built per call lost it. The config itself never changes.

    Args:
        config: the run config (a `PluginArgs`, or a plain namespace standing in for the config, is returned as it is).
    """
    if isinstance(config, PluginArgs) or not isinstance(config, SlimeArgs):
        return config
    held = _VIEWS.get(id(config))
    if held is None or held[0] is not config:
        held = (config, PluginArgs.from_config(config))
        _VIEWS[id(config)] = held
        while len(_VIEWS) > _MAX_VIEWS:
            del _VIEWS[next(iter(_VIEWS))]
    return held[1]


def config_error_from_validation(error: ValidationError, *, where: Mapping[str, str] | None = None) -> ConfigError:
    """Turns a pydantic `ValidationError` into a one-line `ConfigError` naming the flags.

    Args:
        error: The error raised by `SlimeArgs.model_validate`.
        where: Optional `field -> "file:line"` of values read from YAML, appended to their messages.

    Returns:
        A `ConfigError` whose message lists each problem as `--flag: message (got value)`.
    """
    parts = []
    for err in error.errors(include_url=False):
        cause = (err.get("ctx") or {}).get("error")
        loc = err.get("loc") or ()
        if isinstance(cause, ConfigError):  # already names its flag; the YAML line, where known, is added
            parts.append(str(cause))
            if where and loc and str(loc[0]) in where:
                parts[-1] += f" [{where[str(loc[0])]}]"
            continue
        msg = err["msg"].removeprefix("Value error, ")
        if not loc:
            parts.append(msg)
            continue
        flag = field_to_flag(str(loc[0]))
        if err["type"] == "missing":
            parts.append(f"{flag} is required")
        elif err["type"] == "extra_forbidden":
            parts.append(f"unknown option {flag}")
        else:
            parts.append(f"{flag}: {msg} (got {err.get('input')!r})")
        if where and str(loc[0]) in where:
            parts[-1] += f" [{where[str(loc[0])]}]"
    return ConfigError("; ".join(parts))
