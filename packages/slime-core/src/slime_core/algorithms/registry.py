"""String-keyed registries for advantage estimators and policy losses.

Algorithms are chosen by name from the run config (`--advantage-estimator grpo`). Policy losses register
themselves with a decorator::

    @register_policy_loss("ppo")
    def ppo_policy_loss(cfg, *, log_probs, old_log_probs, advantages, loss_mask, response_lengths): ...

Advantage estimators are specs (`slime_core.estimators.EstimatorSpec`: function, reward normalization,
policy loss, needs); `ADVANTAGE_ESTIMATORS` here is that registry, and `register_advantage` remains as a
decorator that registers a function with a spec built from keyword facts. An unknown name raises `KeyError`
listing the known ones.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slime_core.estimators import ESTIMATORS, EstimatorSpec, get_estimator, register_estimator

logger = logging.getLogger(__name__)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "POLICY_LOSSES",
    "Registry",
    "get_advantage_estimator",
    "get_policy_loss",
    "register_advantage",
    "register_policy_loss",
]


class Registry:
    """A named table of functions, filled by a decorator.

    Args:
        kind: what the entries are, used in error messages (e.g. "advantage estimator").
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Callable[..., Any]] = {}

    def register(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Return a decorator that records the decorated function under `name`.

        Raises:
            ValueError: if `name` is already registered.
        """

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            if name in self._entries:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._entries[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> Callable[..., Any]:
        """Look up `name`.

        Raises:
            KeyError: if `name` is unknown; the message lists the known names.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {sorted(self._entries)}") from None

    def names(self) -> list[str]:
        """The registered names, sorted."""
        return sorted(self._entries)


ADVANTAGE_ESTIMATORS = ESTIMATORS
POLICY_LOSSES = Registry("policy loss")


def register_advantage(name: str, **facts: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering an advantage function as estimator `name` (an `EstimatorSpec`).

    The function signature is
    `fn(cfg, *, rewards: list[float], loss_masks: list[Tensor[L_i]], kl: list[Tensor[L_i]],
    values: list[Tensor[L_i]] | None) -> (advantages, returns)`, each a list of `[L_i]` float32.
    `--advantage-estimator` accepts the names registered when `slime_core.config` is first imported.

    Args:
        name: the estimator name.
        **facts: the other `EstimatorSpec` fields (`rewards` defaults to "none": raw rewards).

    Raises:
        ValueError: `name` is already registered.
    """

    def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
        register_estimator(EstimatorSpec(name=name, advantages=fn, **{"rewards": "none", **facts}))
        return fn

    return decorator


def get_advantage_estimator(name: str) -> Callable[..., Any]:
    """Return the advantage function of the estimator registered as `name`.

    Raises:
        KeyError: if unknown (the message lists the known names).
    """
    return get_estimator(name).advantage_fn()


def register_policy_loss(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering a policy loss under `name`.

    The signature is `fn(cfg, *, log_probs, old_log_probs, advantages, loss_mask: Tensor[T],
    response_lengths: list[int]) -> (loss [T], clipfrac [T], ppo_kl [T])` over the concatenated
    response tokens of a micro-batch (all float32 `[T]`, T = Σ L_i).
    """
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> Callable[..., Any]:
    """Return the policy loss registered as `name`.

    Raises:
        KeyError: if unknown (the message lists the known names).
    """
    return POLICY_LOSSES.get(name)
