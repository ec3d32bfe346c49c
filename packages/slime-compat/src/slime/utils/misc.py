"""`slime.utils.misc`: `load_function`, `SingletonMeta` and the small helpers plugins import (original module path)."""

from __future__ import annotations

import logging
import socket
import subprocess
from collections import defaultdict
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from slime_rollout.plugins import load_function as _load_function

if TYPE_CHECKING:
    import torch

__all__ = [
    "Box",
    "SingletonMeta",
    "chunk_named_params_by_size",
    "decode_int32_meta_array",
    "exec_command",
    "get_current_node_ip",
    "get_free_port",
    "group_by",
    "load_function",
    "should_run_periodic_action",
]

logger = logging.getLogger(__name__)


def load_function(path: str) -> Callable[..., Any]:
    """Imports `package.module.attr` (original paths such as `slime.rollout.sglang_rollout.generate` included).

    Raises:
        slime_core.plugins.PluginError: an `ImportError` naming the missing module or attribute.
    """
    return _load_function(path, flag="load_function")


class SingletonMeta(type):
    """Metaclass: the first `Cls(...)` call creates the instance, later calls return it (one per class)."""

    _instances: dict[type, Any] = {}

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        """The class's one instance, created by the first call (later calls' arguments are ignored)."""
        if cls not in SingletonMeta._instances:
            SingletonMeta._instances[cls] = super().__call__(*args, **kwargs)
        return SingletonMeta._instances[cls]

    def clear_instances(cls) -> None:
        """Forgets every singleton instance (the next call creates a new one)."""
        SingletonMeta._instances.clear()


def exec_command(cmd: str, capture_output: bool = False) -> str | None:
    """Runs `cmd` with bash, raising on a non-zero exit; returns stdout when `capture_output`.

    Raises:
        subprocess.CalledProcessError: the command failed (its output is logged when captured).
    """
    logger.info("EXEC: %s", cmd)
    try:
        result = subprocess.run(["bash", "-c", cmd], check=True, capture_output=capture_output, text=capture_output)
    except subprocess.CalledProcessError as e:
        if capture_output:
            logger.error("command failed: stdout=%r stderr=%r", e.stdout, e.stderr)
        raise
    return result.stdout if capture_output else None


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
            return True
        except OSError:
            return False


def get_free_port(start_port: int = 10000, consecutive: int = 1) -> int:
    """The first port >= `start_port` such that it and the next `consecutive - 1` ports are all free."""
    port = start_port
    while not all(_port_free(port + i) for i in range(consecutive)):
        port += 1
    return port


def get_current_node_ip() -> str:
    """IP of this node as Ray sees it (needs a running Ray; IPv6 brackets stripped)."""
    import ray

    return ray.util.get_node_ip_address().strip("[]")


def should_run_periodic_action(
    rollout_id: int, interval: int | None, num_rollout_per_epoch: int | None = None, num_rollout: int | None = None
) -> bool:
    """Whether a periodic action (save, eval) runs after rollout `rollout_id` (0-based).

    True when `interval` is set and: `rollout_id + 1` is a multiple of it, or of `num_rollout_per_epoch` (an
    epoch ended), or `rollout_id` is the last rollout (when `num_rollout` is given).
    """
    if interval is None:
        return False
    if num_rollout is not None and rollout_id == num_rollout - 1:
        return True
    step = rollout_id + 1
    return step % interval == 0 or (num_rollout_per_epoch is not None and step % num_rollout_per_epoch == 0)


def decode_int32_meta_array(meta_info: dict[str, Any], keys: str | Iterable[str]) -> torch.Tensor | None:
    """The int32 array an SGLang reply's `meta_info` holds under the first of `keys` present, flattened.

    `slime_core.routing_replay.decode_int32_meta_array`: base64 of little-endian int32, raw bytes, a tensor, an
    ndarray or a list, each read as the original's helper reads it.

    Returns:
        `[n]` int32 CPU tensor, or None when no key is present or its value is None.

    Raises:
        ValueError: base64 text that is not valid, or bytes whose length is not a multiple of 4.
    """
    from slime_core.routing_replay import decode_int32_meta_array as decode  # torch: only for callers of this

    return decode(meta_info, keys, what="decode_int32_meta_array")


class Box:
    """A read-only holder (`Box(x).inner is x`): passes an object through Ray without it being copied into parts."""

    def __init__(self, inner: Any):
        self._inner = inner

    @property
    def inner(self) -> Any:
        """The boxed object."""
        return self._inner


def group_by(iterable: Iterable[Any], key: Callable[[Any], Hashable] | None = None) -> dict[Hashable, list[Any]]:
    """Items grouped by `key(item)` (the item itself without `key`), in first-seen order; no sorting needed."""
    groups: defaultdict[Hashable, list[Any]] = defaultdict(list)
    for item in iterable:
        groups[key(item) if key is not None else item].append(item)
    return dict(groups)


def chunk_named_params_by_size(
    named_params: Iterable[tuple[str, torch.Tensor]], chunk_size: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """`(name, tensor)` pairs in consecutive buckets of under `chunk_size` bytes (a larger tensor is alone).

    As the original: a bucket is closed before the tensor that would bring it to `chunk_size` bytes or more, that is
    `slime_core.weight_buckets.iter_buckets` with a cap one byte lower (it closes above its cap).
    """
    from slime_core.weight_buckets import iter_buckets  # torch: only for callers of this

    return iter_buckets(named_params, max(chunk_size - 1, 1))
