"""What the engine launcher needs of an engine kind (`EngineKind`), and what the kinds share.

An engine kind (`--rollout-engine`: `sglang.py`, `reference.py`) says how to start one engine process (command
line, environment) and how to tell that the server answering its port is that process. `launcher.py` starts engines
through it and knows no kind by name beyond its table of kinds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from slime_core.config import SlimeArgs
    from slime_rollout.engines.process import EngineProcess

__all__ = ["EngineKind", "PortTaken", "needs_weights_backup"]


class PortTaken(RuntimeError):
    """The engine's port was bound by someone else between probing and starting."""


class EngineKind(Protocol):
    """One `--rollout-engine` value: how its engine processes start and how one is recognised.

    Attributes:
        name: the `--rollout-engine` value.
    """

    name: str

    def command(
        self,
        cfg: SlimeArgs,
        *,
        host: str,
        port: int,
        index: int,
        gpus_per_engine: int,
        base_gpu_id: int | None,
        random_seed: int,
        memory_saver: bool,
        mem_fraction_static: float | None,
    ) -> tuple[list[str], int]:
        """Command line of engine `index` serving HTTP on `host:port`, and the highest port it binds.

        Args:
            cfg: run config.
            host: interface the server binds.
            port: its HTTP port (free when probed).
            index: the engine's position in the run.
            gpus_per_engine: GPUs of each engine (a CPU kind ignores it).
            base_gpu_id: its first GPU on this node (None: `index * gpus_per_engine`).
            random_seed: its sampling seed.
            memory_saver: engines release memory while the trainer runs (colocated or `--offload-rollout`).
            mem_fraction_static: the caller's `--mem-fraction-static`, or None.
        """
        ...

    def env(self) -> dict[str, str]:
        """Environment of the engine process."""
        ...

    def check_own(self, proc: EngineProcess) -> None:
        """Called once `proc` answers its health check.

        Raises:
            PortTaken: the server answering `proc.url` is another process.
        """
        ...


def needs_weights_backup(cfg: SlimeArgs, *, memory_saver: bool) -> bool:
    """Whether engines must keep a host copy of their weights across a memory release (`--enable-weights-cpu-backup`).

    With the memory saver (colocated or `--offload-rollout`), SGLang's `/release_memory_occupation` unmaps the
    weights' GPU memory and `/resume_memory_occupation` maps fresh memory whose contents are lost unless backed up
    to the host (`sglang/srt/managers/scheduler_components/weight_updater.py`, `load_model_with_memory_saver`). A full
    weight sync rewrites every tensor after each resume; runs whose syncs leave weights out need the backup: a LoRA
    sync sends only the adapter (without it the engine served the adapter on zeroed base weights: issue 25), and
    `--freeze-vision-tower` sends the frozen tower on the first sync only, and a delta sync over tensors
    (`--update-weight-mode delta`) sends only the changed tensors, as deltas against what the engine holds. (The
    original slime keeps the MTP draft model, which it never syncs, the same way: `enable_draft_weights_cpu_backup`.)
    """
    delta = cfg.update_weight_mode == "delta" and cfg.weight_sync == "tensor"  # disk deltas reload a full checkpoint
    return memory_saver and bool(cfg.lora_rank or cfg.freeze_vision_tower or delta)
