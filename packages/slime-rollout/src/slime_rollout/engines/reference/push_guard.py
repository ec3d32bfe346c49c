"""The reference engine's guard against mixed weight pushes (`PushGuard`).

A push is the weight buckets an engine receives between two `/update_weight_version` calls (the fence that ends
every push of `slime_rollout.weight_sync`). Every bucket names the push's version (`weight_version`, a field of
SGLang's update requests), so the engine can tell two pushes apart: once a bucket of version V has landed, a
bucket (or a whole-model load from disk) of another version is refused until the fence. Two writers interleaving
their buckets therefore fail loudly on the second writer's first bucket instead of leaving the engine with a mix
of both under the version of whichever fenced last. The fence itself is never refused (SGLang accepts any
`/update_weight_version`, and the recorded wire replies hold the reference engine to that); a fence to another
version than the buckets carry is logged as a warning.

Real SGLang (0.5.16) has no such guard: it applies every bucket and sets its reported version to the bucket's
`weight_version` after each successful request. The client side (`slime_rollout.weight_push`) makes interleaving
impossible among its own pushes; this guard is what catches a second writer it does not know about.
"""

from __future__ import annotations

__all__ = ["PushGuard"]


class PushGuard:
    """Which version the buckets since the last fence carry, and whether a new bucket or a fence may join them.

    A bucket without `weight_version` (an older client) is accepted and not tracked, as SGLang accepts it.
    A whole-model load from disk replaces every weight, so it ends a push like a fence.
    """

    def __init__(self) -> None:
        self.version: str | None = None  # the version of the buckets landed since the last fence, if any
        self.num_buckets = 0

    def refusal(self, version: str | None, endpoint: str) -> str | None:
        """Why a bucket of `version` sent to `endpoint` must be refused, or None to accept it."""
        if version is None or self.version is None or str(version) == self.version:
            return None
        return (
            f"{endpoint}: refused a bucket of weight_version {str(version)!r}: {self.num_buckets} bucket(s) of "
            f"weight_version {self.version!r} have landed since the last /update_weight_version, so two weight "
            "pushes are interleaved (two writers); finish that push with /update_weight_version, or reload the "
            "whole model from disk"
        )

    def landed(self, version: str | None) -> None:
        """Records a bucket applied with `version`."""
        if version is not None:
            self.version = str(version)
            self.num_buckets += 1

    def fence_mismatch(self, new_version: str) -> str | None:
        """What is odd about `/update_weight_version` to `new_version` (the buckets carry another version), or None."""
        if self.version is None or str(new_version) == self.version:
            return None
        return (
            f"/update_weight_version: tagging the weights {str(new_version)!r}, but the {self.num_buckets} "
            f"bucket(s) since the last /update_weight_version carry weight_version {self.version!r}"
        )

    def close(self) -> None:
        """Ends the push (a fence or a whole-model load)."""
        self.version, self.num_buckets = None, 0
