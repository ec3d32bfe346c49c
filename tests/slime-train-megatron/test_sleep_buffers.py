"""`--offload-train-pin-memory` under Megatron: the pinned host buffers of a sleep are kept and reused by the next.

Before, the Megatron backend pinned new buffers at every sleep and freed them at every wake-up whatever the flag
said (accepted and ignored; it changes host memory and the cost of each sleep). The copies themselves need CUDA:
here the offload and reload are stand-ins that record which buffers each sleep was handed.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("megatron.core")

from slime_train_megatron import trainer_parts  # noqa: E402
from slime_train_megatron.sleep import host_buffer, host_buffers  # noqa: E402


@pytest.fixture
def offloads(monkeypatch):
    """Each sleep's `kept` argument; each sleep "moves" two storages into fresh 8- and 16-byte buffers."""
    calls = []

    def offload(model, optimizer, kept=None):
        calls.append(kept)
        return [(None, host_buffer(8, kept[0] if kept else None) if kept else torch.empty(8, dtype=torch.uint8)),
                (None, kept[1] if kept else torch.empty(16, dtype=torch.uint8))]  # fmt: skip

    monkeypatch.setattr(trainer_parts, "offload_to_cpu", offload)
    monkeypatch.setattr(trainer_parts, "reload_from_cpu", lambda state: None)
    return calls


def test_with_the_flag_the_next_sleep_reuses_the_buffers_of_the_last(offloads):
    residency = trainer_parts.Residency(model=None, optimizer=None, keep_host_buffers=True)
    residency.sleep()
    first = host_buffers(residency.state)
    residency.wake_up()
    assert not residency.asleep and residency.kept == first  # held while awake
    residency.sleep()
    assert offloads[0] is None and offloads[1] == first
    assert all(a is b for a, b in zip(host_buffers(residency.state), first, strict=True))


def test_without_the_flag_every_sleep_allocates_and_the_wake_up_lets_go(offloads):
    residency = trainer_parts.Residency(model=None, optimizer=None)
    for _ in range(2):
        residency.sleep()
        residency.wake_up()
        assert residency.kept is None
    assert offloads == [None, None]


def test_a_kept_buffer_of_another_size_is_not_reused():
    kept = torch.empty(8, dtype=torch.uint8)
    assert host_buffer(8, kept) is kept
    if torch.cuda.is_available():  # pinning needs an accelerator
        other = host_buffer(4, kept)
        assert other is not kept and other.numel() == 4 and other.is_pinned()


def test_the_backends_pass_the_flag_to_their_residency():
    import inspect

    from slime_train_megatron import backend, critic_backend

    for module in (backend, critic_backend):
        assert "Residency(self.model, self.optimizer, cfg.offload_train_pin_memory)" in inspect.getsource(module)
