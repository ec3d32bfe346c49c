"""The reference engine's guard against mixed weight pushes (`PushGuard`).

A push is the weight buckets an engine receives between two `/update_weight_version` calls (the fence that ends
every push of `slime_rollout.weight_sync.updaters`). Every bucket names the push's version (`weight_version`, a field of
SGLang's update requests), so the engine can tell two pushes apart.

The rule: once a bucket of version V has landed, the push is open until the fence, and every update until then
(a bucket, or a whole-model load from `/update_weights_from_disk`) must carry `weight_version` V; one of another
version or without a version is refused (HTTP 400, nothing applied). A whole-model load of V replaces every weight
and closes the push. Outside an open push every update is accepted, tagged or not, as SGLang accepts it. The fence
itself is never refused (SGLang accepts any `/update_weight_version`, and the recorded wire replies hold the
reference engine to that); a fence to another version than the buckets carry is logged as a warning.

What it can detect: a second writer whose updates carry another version, or none, while a push is open; it fails
loudly on that writer's first update instead of leaving the engine with a mix of both under the version of
whichever fenced last. What it cannot: two writers pushing the same version (the buckets are indistinguishable, so
they interleave unrefused); a second writer that starts after a fence (its push is a push of its own); or a
push's buckets arriving after another writer's fence closed it early (they open a new push of their version).
Telling writers apart would need a writer id on the wire, which SGLang's requests do not have.

Real SGLang (0.5.16) has no such guard: it applies every bucket and sets its reported version to the bucket's
`weight_version` after each successful request. The client side (`slime_rollout.weight_sync.push`) makes interleaving
impossible among its own pushes; this guard is what catches a second writer it does not know about.
"""

from __future__ import annotations

__all__ = ["PushGuard"]


class PushGuard:
    """Which version the buckets since the last fence carry, and whether a new bucket or a fence may join them.

    An update without `weight_version` (an older client) is accepted and not tracked outside an open push, as
    SGLang accepts it, and refused inside one. A whole-model load from disk replaces every weight, so once
    accepted it ends a push like a fence.
    """

    def __init__(self) -> None:
        self.version: str | None = None  # the version of the buckets landed since the last fence, if any
        self.num_buckets = 0

    def refusal(self, version: str | None, endpoint: str) -> str | None:
        """Why an update (a bucket or a whole-model load) of `version` sent to `endpoint` must be refused, or None.

        Refused while a push is open (a bucket landed since the last fence) unless it carries that push's version.
        """
        if self.version is None or (version is not None and str(version) == self.version):
            return None
        kind = "a whole-model load" if endpoint.endswith("_from_disk") else "a bucket"
        what = f"{kind} without weight_version" if version is None else f"{kind} of weight_version {str(version)!r}"
        return (
            f"{endpoint}: refused {what}: {self.num_buckets} bucket(s) of weight_version {self.version!r} have "
            "landed since the last /update_weight_version, so two weight pushes are interleaved (two writers); "
            f"send it with weight_version {self.version!r}, or end that push with /update_weight_version first"
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
