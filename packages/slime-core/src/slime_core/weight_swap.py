"""Reference and teacher weights as host copies swapped into the trained model for their forwards.

Both training backends keep the KL reference (`--ref-load`, `--ref-update-interval`) and the on-policy-distillation
teacher (`--opd-teacher-load` with `--opd-type fsdp|megatron`) the way the original's Megatron backend does
(`TensorBackuper`): a CPU copy of this rank's parameters (an FSDP shard, a TP/PP slice) per role, copied into
the live parameters for the forward and the trained weights copied back after it, so the extra models never hold
accelerator memory between uses and need no model of their own. What is swapped is whatever the backend's
`named_params` yields: this rank's local tensors (an FSDP backend passes `DTensor.to_local()` views).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator

import torch

__all__ = ["ROLES", "WeightSwap"]

ROLES = ("ref", "teacher")
"""The roles a `WeightSwap` holds besides the trained weights (`model="actor"`)."""

NamedParams = Callable[[], Iterable[tuple[str, torch.Tensor]]]


class WeightSwap:
    """Host snapshots of a model's parameters by role, and the swap that runs a forward with one of them.

    Args:
        named_params: returns this rank's `(name, local parameter tensor)` pairs, the same names in every call.
        missing: for each role, the error message when it is asked for but not held (names the flags).

    Example:
        >>> swap = WeightSwap(model.named_parameters, missing={"ref": "no reference model"})  # doctest: +SKIP
        >>> swap.hold("ref")  # the current weights become the reference  # doctest: +SKIP
        >>> with swap.swapped("ref"):  # doctest: +SKIP
        ...     ref_logits = model(tokens)
    """

    def __init__(self, named_params: NamedParams, *, missing: dict[str, str] | None = None) -> None:
        """Holds nothing yet."""
        self._named_params = named_params
        self._missing = dict(missing or {})
        self._held: dict[str, dict[str, torch.Tensor]] = {}

    def snapshot(self) -> dict[str, torch.Tensor]:
        """A CPU copy of the current local parameters by name (detached)."""
        return {n: p.detach().to("cpu", copy=True) for n, p in self._named_params()}

    @torch.no_grad()
    def restore(self, snapshot: dict[str, torch.Tensor]) -> None:
        """Copies `snapshot` into the live parameters in place (their device, dtype and sharding are kept).

        Raises:
            KeyError: a parameter missing from `snapshot` (it was taken of another model).
        """
        for n, p in self._named_params():
            p.copy_(snapshot[n], non_blocking=True)

    def hold(self, role: str, snapshot: dict[str, torch.Tensor] | None = None) -> None:
        """Keeps `snapshot` (default: the current weights) as `role`'s weights, replacing any held before.

        Raises:
            ValueError: an unknown role.
        """
        _check_role(role)
        self._held[role] = self.snapshot() if snapshot is None else snapshot

    def holds(self, role: str) -> bool:
        """Whether weights of `role` are held."""
        return role in self._held

    def capture(self, role: str, load: Callable[[], None]) -> None:
        """Holds as `role` the weights `load()` puts into the model, then puts the current weights back.

        Used to read a teacher or reference checkpoint through the backend's own loader (HF or its checkpoint
        format) without a second model.
        """
        _check_role(role)
        current = self.snapshot()
        load()
        self.hold(role)
        self.restore(current)

    @contextlib.contextmanager
    def swapped(self, model: str) -> Iterator[None]:
        """Runs the body with `model`'s weights in place (`"actor"`: the trained ones, no copy); restores after.

        Raises:
            ValueError: an unknown `model`, or a role that is not held (the message given for it at construction).
        """
        if model == "actor":
            yield
            return
        if model not in ROLES:
            raise ValueError(f"model must be 'actor', 'ref' or 'teacher', got {model!r}")
        if model not in self._held:
            raise ValueError(self._missing.get(model, f"no {model} weights are held"))
        backup = self.snapshot()
        self.restore(self._held[model])
        try:
            yield
        finally:
            self.restore(backup)


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"unknown weight role {role!r}; known: {ROLES}")
