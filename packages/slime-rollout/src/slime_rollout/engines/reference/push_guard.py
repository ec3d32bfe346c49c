"""The reference engine's guard against mixed weight pushes (`PushGuard`).

A push is the weight buckets an engine receives between two `/update_weight_version` calls (the fence that ends
every push of `slime_rollout.weight_sync.updaters`). Every bucket names the push's version (`weight_version`, a field of
SGLang's update requests), so the engine can tell two pushes apart.

The rules, while a push is open (a bucket of version V has landed since the last fence):

* every bucket must carry `weight_version` V; one of another version or without a version is refused;
* a bucket must not bring other bytes for a tensor that already landed in this push: a full push sends each tensor
  once, so that is a second writer of the same version (the same bytes again are a retry of a request that landed,
  accepted);
* a whole-model load (`/update_weights_from_disk`) is refused whatever its version: a disk push is that one load, so
  it comes from another writer, and the open push's later buckets would land on top of it.

A refused update applies nothing (HTTP 400). A whole-model load outside a push replaces every weight and ends any
push. Outside an open push every update is accepted, tagged or not, as SGLang accepts it. The fence itself is never
refused (SGLang accepts any `/update_weight_version`, and the recorded wire replies hold the reference engine to
that); a fence to another version than the buckets carry is logged as a warning.

What it can detect: a second writer whose buckets overlap an open push, whatever versions they carry; it fails
loudly on that writer's first refused update instead of leaving the engine with a mix under the version of whichever
fenced last. What it cannot: a second writer that starts after a fence (its push is a push of its own); or a push's
buckets arriving after another writer's fence closed it early (they open a new push of their version). Telling
writers apart would need a writer id on the wire, which SGLang's requests do not have. A writer that dies mid-push
leaves its push open until a fence: `/update_weight_version` ends it.

Real SGLang (0.5.16) has no such guard: it applies every bucket and sets its reported version to the bucket's
`weight_version` after each successful request. The client side (`slime_rollout.weight_sync.push`) makes interleaving
impossible among its own pushes; this guard is what catches a second writer it does not know about.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from slime_rollout.engines.weight_delta import checksum, tensor_bytes

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
        self.digests: dict[str, str] = {}  # tensor name -> digest of the bytes that landed in the open push
        self._pending: dict[str, str] = {}  # the digests of the bucket being checked, recorded once it lands

    def refusal(self, version: str | None, endpoint: str) -> str | None:
        """Why an update (a bucket or a whole-model load) of `version` sent to `endpoint` must be refused, or None.

        Refused while a push is open (a bucket landed since the last fence): a bucket unless it carries that push's
        version, a whole-model load always.
        """
        disk = endpoint.endswith("_from_disk")
        if self.version is None or (not disk and version is not None and str(version) == self.version):
            return None
        kind = "a whole-model load" if disk else "a bucket"
        what = f"{kind} without weight_version" if version is None else f"{kind} of weight_version {str(version)!r}"
        advice = "" if disk else f"send it with weight_version {self.version!r}, or "
        return (
            f"{endpoint}: refused {what}: {self.num_buckets} bucket(s) of weight_version {self.version!r} have "
            "landed since the last /update_weight_version, so two weight pushes are interleaved (two writers); "
            f"{advice}end that push with /update_weight_version first"
        )

    def bucket_refusal(self, named: Sequence[tuple[str, torch.Tensor]], endpoint: str) -> str | None:
        """Why a bucket that passed `refusal` must still be refused, or None: other bytes for a tensor of this push.

        Args:
            named: the bucket's `(name, tensor)` pairs as received (any dtype, CPU).
            endpoint: the route, for the message.
        """
        self._pending = {name: _digest(tensor) for name, tensor in named}
        clash = sorted(n for n, d in self._pending.items() if self.digests.get(n, d) != d)
        if not clash:
            return None
        return (
            f"{endpoint}: refused a bucket of weight_version {self.version!r}: {len(clash)} of its tensors "
            f"({', '.join(clash[:3])}{' ...' if len(clash) > 3 else ''}) already landed in this push with other "
            "values, so two writers push this weight_version at once; end that push with /update_weight_version "
            "first"
        )

    def landed(self, version: str | None) -> None:
        """Records a bucket applied with `version` (and the digests `bucket_refusal` computed for it)."""
        if version is not None:
            self.version = str(version)
            self.num_buckets += 1
            self.digests.update(self._pending)
        self._pending = {}

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
        self.digests, self._pending = {}, {}


def _digest(tensor: torch.Tensor) -> str:
    """A tensor's dtype, shape and xxh3-128 of its bytes (the same bytes as another shape differ)."""
    return f"{tensor.dtype}{tuple(tensor.shape)}:{checksum('xxh3-128', tensor_bytes(tensor))}"
