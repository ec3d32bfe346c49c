"""Advantage estimators as registered specs: one `EstimatorSpec` per `--advantage-estimator` name.

A spec holds every fact the rest of slime needs about an estimator: its advantage function, how the
rollout side normalizes its rewards, the policy loss it trains with, whether it needs a critic or a
reference model, whether the trainer may reuse the training forward's log-probs as the old ones, and the
flags it requires. The config (`--advantage-estimator` choices and validation), reward post-processing
(`slime_core.train_data`), the policy objective and the shared train step all read the spec, so adding an
estimator is one `register_estimator(EstimatorSpec(...))` call plus its advantage function.

This module imports neither torch nor the config package (the config's field type is built from the
names registered here); an advantage function is named by import path and resolved on first use.

Example:
    >>> spec = get_estimator("grpo")
    >>> spec.rewards, spec.policy_loss, spec.group_wise
    ('group_mean_std', 'ppo', True)
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

from slime_core.registry import Problem, Registry, UnknownNameError

if TYPE_CHECKING:
    from slime_core.config.args import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = [
    "ESTIMATORS",
    "ESTIMATOR_FLAGS",
    "EstimatorRegistry",
    "EstimatorSpec",
    "RewardNormalization",
    "estimator_names",
    "get_estimator",
    "register_estimator",
]

RewardNormalization = Literal["group_mean_std", "group_mean", "leave_one_out", "none"]
"""How `postprocess_rewards` turns raw rewards into the estimator's input, within each prompt group:
`group_mean_std` subtracts the group mean and divides by the group std (GRPO; the division is skipped with
`--disable-grpo-std-normalization`), `group_mean` only subtracts the mean, `leave_one_out` subtracts the mean
of the other samples (RLOO), `none` keeps the raw reward."""

_REWARD_NORMALIZATIONS = ("group_mean_std", "group_mean", "leave_one_out", "none")

ESTIMATOR_FLAGS = ("gamma", "lambd", "kl_coef")
"""Config fields of the advantage math that only some estimators read (`EstimatorSpec.reads`): set away from their
defaults with an estimator that does not read them, they change nothing and validation warns once."""


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class EstimatorSpec:
    """Everything slime knows about one advantage estimator.

    Example:
        >>> spec = EstimatorSpec(name="my_est", advantages="my_pkg.adv:my_advantages", rewards="group_mean")
        >>> spec.group_wise, spec.needs_critic
        (True, False)

    Attributes:
        name: the `--advantage-estimator` value.
        advantages: the advantage function, or its import path `"module:attr"` (resolved lazily so that
            the registry stays importable without torch). Signature
            `fn(cfg, *, rewards: list[float], loss_masks: N×[L_i], kl: N×[L_i], values: N×[L_i] | None)
            -> (advantages N×[L_i], returns N×[L_i])`, float32.
        rewards: reward normalization applied by the rollout side before the advantage function
            (see `RewardNormalization`).
        policy_loss: name of the registered policy loss it trains with (`slime_core.algorithms.registry`).
        needs_critic: trains a value model (PPO with GAE).
        needs_ref: needs reference log-probs even without a KL term.
        reuses_old_log_probs: when a rollout trains in a single optimizer step (and without reward KL),
            the trainer may take the training forward's detached log-probs as the old ones instead of a
            separate forward (the weights have not moved, so they are equal).
        required_flags: boolean config fields that must be set (e.g. `("normalize_advantages",)`).
        reads: the `ESTIMATOR_FLAGS` its advantage function uses (`("gamma", "lambd")` for GAE); another one set
            away from its default draws a one-line warning, as the original accepts it silently.
        check: extra validation `fn(cfg)` run once with the config (raises `ConfigError`, may warn).
        preflight: pre-launch check `fn(cfg) -> list[Problem]` run by the app before anything starts.
    """

    name: str
    advantages: str | Callable[..., Any]
    rewards: RewardNormalization
    policy_loss: str = "ppo"
    needs_critic: bool = False
    needs_ref: bool = False
    reuses_old_log_probs: bool = False
    required_flags: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    check: Callable[[SlimeArgs], None] | None = None
    preflight: Callable[[SlimeArgs], list[Problem]] | None = None

    def __post_init__(self) -> None:
        if self.rewards not in _REWARD_NORMALIZATIONS:
            raise ValueError(f"estimator {self.name!r}: rewards must be one of {_REWARD_NORMALIZATIONS}")
        if unknown := set(self.reads) - set(ESTIMATOR_FLAGS):
            raise ValueError(f"estimator {self.name!r}: reads {sorted(unknown)}, not among {ESTIMATOR_FLAGS}")

    @property
    def group_wise(self) -> bool:
        """Whether its rewards are normalized within prompt groups (needs whole groups of samples)."""
        return self.rewards != "none"

    def advantage_fn(self) -> Callable[..., Any]:
        """The advantage function (imported on first use when given as `"module:attr"`).

        Raises:
            ImportError: the module cannot be imported.
            AttributeError: the module has no such attribute.
        """
        if callable(self.advantages):
            return self.advantages
        module, _, attr = self.advantages.partition(":")
        return getattr(importlib.import_module(module), attr)

    def validate(self, cfg: SlimeArgs) -> None:
        """Checks the flags this estimator requires, warns about those it ignores, then runs its `check` hook.

        Raises:
            ConfigError: a required flag is not set, or the hook rejects the config.
        """
        # Imported here: slime_core.config imports this module to build the flag's choices.
        from slime_core.config.base import ConfigError, field_to_flag

        for field in self.required_flags:
            if not getattr(cfg, field):
                raise ConfigError(f"--advantage-estimator {self.name} requires {field_to_flag(field)}")
        self._warn_unread(cfg)
        if self.check is not None:
            self.check(cfg)

    def _warn_unread(self, cfg: SlimeArgs) -> None:
        """Warns once about `ESTIMATOR_FLAGS` set away from their defaults that this estimator does not read.

        The defaults (original launch scripts pass `--gamma 1.0 --lambd 1.0` with GRPO) and runs with
        `--custom-advantage-function-path` (the plugin gets `args` and may read them) stay silent.
        """
        from slime_core.config.base import field_to_flag, non_default, warn_once

        if cfg.custom_advantage_function_path:
            return
        unread = [f for f in non_default(cfg, ESTIMATOR_FLAGS) if f not in self.reads]
        if not unread:
            return
        readers = {f: [s.name for s in ESTIMATORS._specs.values() if f in s.reads] for f in unread}
        set_flags = ", ".join(f"{field_to_flag(f)} {getattr(cfg, f)}" for f in unread)
        used_by = "; ".join(
            f"{field_to_flag(f)} is read by {', '.join(r) or 'no built-in'}" for f, r in readers.items()
        )
        still = "; the reward KL is still computed and logged as rollout/kl" if "kl_coef" in unread else ""
        warn_once(
            f"estimator_unread:{self.name}:{','.join(unread)}",
            f"{set_flags}: no effect with --advantage-estimator {self.name}, which does not read "
            f"{'them' if len(unread) > 1 else 'it'} ({used_by}){still}",
        )

    def preflight_problems(self, cfg: SlimeArgs) -> list[Problem]:
        """The problems its `preflight` hook finds (none without a hook)."""
        return [] if self.preflight is None else self.preflight(cfg)


class EstimatorRegistry:
    """Estimator specs by name.

    The built-ins and in-process registrations come in registration order, then the
    `slime.advantage_estimators` entry points of installed packages (each naming an `EstimatorSpec`).
    """

    group = "slime.advantage_estimators"

    def __init__(self) -> None:
        self._specs: dict[str, EstimatorSpec] = {}
        self._installed = Registry(self.group, flag="--advantage-estimator", kind="advantage estimator",
                                   entry_type=EstimatorSpec)  # fmt: skip

    def register(self, spec: EstimatorSpec) -> EstimatorSpec:
        """Adds `spec` under `spec.name` and returns it.

        Raises:
            ValueError: the name is already registered.
        """
        if spec.name in self._specs:
            raise ValueError(f"advantage estimator {spec.name!r} is already registered")
        self._specs[spec.name] = spec
        return spec

    def get(self, name: str) -> EstimatorSpec:
        """The spec registered as `name` (an entry point's is imported on first use).

        Raises:
            KeyError: unknown name; the message lists the known ones and the entry-point group.
            ImportError: an entry point's module does not import.
        """
        if name in self._specs:
            return self._specs[name]
        if name in self._installed:
            return self._installed.get(name)
        raise UnknownNameError(
            f"unknown advantage estimator {name!r}; known: {self.names()} (a package adds one under "
            f'[project.entry-points."{self.group}"])'
        )

    def check_name(self, name: str) -> None:
        """Raises the `KeyError` of `get` unless `name` is registered (imports nothing)."""
        if name not in self:
            self.get(name)

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(set(self._specs) | set(self._installed.names()))

    def __contains__(self, name: object) -> bool:
        return name in self._specs or name in self._installed

    def __iter__(self) -> Iterator[EstimatorSpec]:
        """The specs: built-ins and in-process registrations, then installed entry points (imported here)."""
        yield from self._specs.values()
        for name in self._installed.names():
            if name not in self._specs:
                yield self._installed.get(name)


ESTIMATORS = EstimatorRegistry()


def register_estimator(spec: EstimatorSpec) -> EstimatorSpec:
    """Registers an estimator spec (`--advantage-estimator spec.name`).

    The config's `--advantage-estimator` choices are the names registered when `slime_core.config` is
    first imported, so built-in estimators are registered at the bottom of this module.

    Raises:
        ValueError: the name is already registered.
    """
    return ESTIMATORS.register(spec)


def get_estimator(name: str) -> EstimatorSpec:
    """The spec of estimator `name`.

    Raises:
        KeyError: unknown name; the message lists the known ones.
    """
    return ESTIMATORS.get(name)


def estimator_names() -> tuple[str, ...]:
    """Registered estimator names: built-ins in registration order, then installed ones sorted (imports nothing)."""
    builtin = tuple(ESTIMATORS._specs)
    return builtin + tuple(n for n in ESTIMATORS.names() if n not in builtin)


# ---------------------------------------------------------------- built-in estimators

_ADVANTAGES = "slime_core.algorithms.advantages:"


def _cispo_eps(cfg: SlimeArgs) -> None:
    from slime_core.config.base import warn_once

    if cfg.eps_clip < 1.0:
        warn_once("cispo_eps", f"CISPO with --eps-clip {cfg.eps_clip} < 1; the canonical setting is --eps-clip 1")


register_estimator(
    EstimatorSpec(
        name="grpo",  # Shao et al. 2024 (DeepSeekMath)
        advantages=_ADVANTAGES + "broadcast_reward_advantages",
        rewards="group_mean_std",
        reuses_old_log_probs=True,
    )
)
register_estimator(
    EstimatorSpec(
        name="gspo",  # Zheng et al. 2025: sequence-level ratio
        advantages=_ADVANTAGES + "broadcast_reward_advantages",
        rewards="group_mean_std",
        policy_loss="gspo",
    )
)
register_estimator(
    EstimatorSpec(
        name="cispo",  # MiniMax-M1 2025: clipped IS weight
        advantages=_ADVANTAGES + "broadcast_reward_advantages",
        rewards="group_mean_std",
        policy_loss="cispo",
        reuses_old_log_probs=True,
        check=_cispo_eps,
    )
)
register_estimator(
    EstimatorSpec(
        name="rloo",  # Ahmadian et al. 2024
        advantages=_ADVANTAGES + "rloo_advantages",
        rewards="leave_one_out",
        reads=("kl_coef",),  # the reward-shaping KL
    )
)
register_estimator(
    EstimatorSpec(
        name="reinforce_plus_plus",  # Hu et al. 2025
        advantages=_ADVANTAGES + "reinforce_plus_plus_advantages",
        rewards="none",
        required_flags=("normalize_advantages",),
        reads=("gamma", "kl_coef"),  # discounted returns of the KL-shaped rewards
    )
)
register_estimator(
    EstimatorSpec(
        name="reinforce_plus_plus_baseline",  # Hu et al. 2025
        advantages=_ADVANTAGES + "reinforce_plus_plus_baseline_advantages",
        rewards="group_mean",
        reuses_old_log_probs=True,
        required_flags=("normalize_advantages",),
        reads=("kl_coef",),
    )
)
register_estimator(
    EstimatorSpec(
        name="ppo",  # Schulman et al. 2017, GAE (Schulman et al. 2016)
        advantages=_ADVANTAGES + "ppo_gae_advantages",
        rewards="none",
        needs_critic=True,
        reads=("gamma", "lambd", "kl_coef"),  # GAE over the KL-shaped rewards
    )
)
