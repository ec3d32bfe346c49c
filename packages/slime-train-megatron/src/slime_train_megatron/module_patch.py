"""One attribute of a megatron-core module or class that a switch of ours replaces, process-wide, and restores.

megatron-core calls some functions through module globals (`megatron.core.optimizer.optimizer.get_grad_norm_fp32`)
or class attributes (`DistributedOptimizer._copy_main_params_to_model_params`); our faster or traceable versions are
put there by switches (`torch_optimizer.use_foreach_grad_norm`, `traceable.use_traceable_layer_pieces`, ...). A
`ModulePatch` keeps the value megatron-core had when it was made, so a switch turned off puts exactly that back, and
our versions can fall back to it for the cases they do not cover.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ModulePatch"]


class ModulePatch:
    """`owner.name`, replaceable by ours and restorable to the value it had when this patch was made.

    Make patches at import of the module that defines the replacement (before any switch runs), so `original` is
    megatron-core's own.

    Attributes:
        owner: the module or class holding the attribute.
        name: the attribute's name.
        original: its value when the patch was made (call it for the cases a replacement leaves to megatron-core).
    """

    def __init__(self, owner: Any, name: str) -> None:
        self.owner = owner
        self.name = name
        self.original = getattr(owner, name)

    def use(self, replacement: Any, on: bool) -> None:
        """Puts `replacement` in place (`on`) or the original back (not `on`)."""
        setattr(self.owner, self.name, replacement if on else self.original)

    def __repr__(self) -> str:
        return f"ModulePatch({getattr(self.owner, '__name__', self.owner)!r}.{self.name})"
