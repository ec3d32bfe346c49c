"""Compile warm-up: a side process compiles the decoder layer's graphs before the first step needs them (issue 26).

With compiled decoder layers (`--fsdp-compile-layers`, the CUDA default) the first step of a launch on a fresh
machine spends most of its time in torch.compile: 18 of step 0's 26 s for qwen3-0.6b on one H100, 7.5 s when
inductor's on-disk caches already hold the graphs. The graphs depend on the layer's architecture, dtypes, attention
implementation and the regime of the packed length, not on the weights or the vocabulary. So a side process builds
a stand-in of the trained model with one layer (one of each kind where `layer_types` mixes kinds; random weights, a
256-token vocabulary) through the trainer's own code
path (`FSDPTrainBackend.init`, world size 1), runs the no-grad log-prob forward and a forward + backward on dummy
packed rows of the run's micro-batch sizes (the no-grad forward only where a step runs one), and exits. The
compiled `fused` log-prob head is the exception: its
graphs are guarded on the vocabulary's range, and its backward differs with the loss (an entropy term or not), so
it is warmed on its own at the trained vocabulary with the run's loss (`compile_warmup_head.warm_up_head`;
before, a qwen3 step after the warm-up missed these 3 graphs on CPU). Inductor's caches (FX graph and AOT autograd
caches, Triton kernels; `TORCHINDUCTOR_CACHE_DIR`, by default `/tmp/torchinductor_<user>`) then hold what the real
layers compile, and their first forward loads instead of compiling.

When it runs (`start_compile_warm_up`, called by the trainer rank before `init`): trainer GPUs of their own start it
while the engines start. Colocated ranks start it *gated* at the same moment: the process imports its stack, writes
the stand-in checkpoint and then waits, touching no GPU, until the rank opens the gate (`CompileWarmUp.release`)
once the engines are up and released their memory (SGLang sizes its KV cache from the free memory it measures at
start-up, which a concurrent warm-up would shrink); so its CPU-only start (the interpreter's imports and 1.2 s of
stand-in on one H100 host at 1f79974) overlaps the engines' start-up, and its compiling (35–40 s there) the model load
and the first rollouts. Its activations are capped (`ACTIVATION_BUDGET`). One warm-up runs per node and cache
directory (a file lock). It never delays a step: while it still compiles, the rank's steps run the compiled
layers eagerly (`torch.compiler.set_stance("force_eager")`, `CompileWarmUp.pending`; not with flex attention, whose
eager form materializes the score matrix, nor next to a colocated engine that stays resident: eager layers keep more
activations), and the first step after it finished loads its graphs from the cache. One
still compiling after `DEFER_S` is stopped and the step compiles what is not cached. Measured on one H100 (qwen3-0.6b
colocated, 2c37186), waiting for an unfinished warm-up at the first step cost 45 s to save 11 s of compiling. A
warm-up that fails or is stopped is logged with its log's tail. `--no-fsdp-compile-warmup`
turns it off. With `--context-parallel-size` > 1 none starts: its attention needs a CP group that a world of one
does not have. With `--lora-rank` the layers stay eager unless `--fsdp-compile-layers` is given
(`model_loading.LORA_EAGER_REASON`), so none starts either; when it is given, the stand-in is built from the run's
config and gets the same peft adapters.

The rank removes the process's folder (`WORKDIR_PREFIX*` under the temp directory: the stand-in checkpoint, up to a
GiB for a wide MoE layer) when the warm-up ends or the rank shuts down, and holds a lock on it while it lives; a
rank that was killed leaves its folder unlocked, and the next warm-up on the node removes it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import logging
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch

from slime_core.config import SlimeArgs

logger = logging.getLogger(__name__)

__all__ = [
    "ACTIVATION_BUDGET",
    "ANOTHER_RUNS",
    "DEFER_S",
    "WAIT_S",
    "WORKDIR_PREFIX",
    "CompileWarmUp",
    "defers_compile",
    "run_warm_up",
    "start_compile_warm_up",
    "warm_up_token_counts",
]

#: Seconds `CompileWarmUp.wait` waits by default for a warm-up that has not finished before stopping it. 0: a step
#: never waits; while the warm-up runs, steps run eagerly instead (`CompileWarmUp.pending`).
WAIT_S = 0.0
#: Seconds after its start during which steps run eagerly rather than compile while the warm-up still compiles.
DEFER_S = 300.0
#: Bytes of saved activations the stand-in layer may hold (it may share the GPU with colocated engines).
ACTIVATION_BUDGET = 1 << 30
#: Exit status of a warm-up that found another one holding this node's lock.
ANOTHER_RUNS = 3
_LOCK_NAME = "slime-compile-warmup.lock"
#: Name prefix of a warm-up's folder in the temp directory.
WORKDIR_PREFIX = "slime-compile-warmup-"
_OWNER = "owner.lock"  # held by the rank that owns the folder, for as long as it lives
_GATE = "go"  # a gated process waits for this file in its folder before it touches the GPU
_GATE_POLL_S = 0.2
_VOCAB = 256
_SEQ_LEN = 512  # tokens per dummy sequence: half prompt, half response
_SMALL = 1024  # a last, short micro-batch: inductor may guard the first graph on the packed length's regime


def warm_up_token_counts(cfg: SlimeArgs, hidden_size: int, intermediate_size: int, num_layers: int = 1) -> list[int]:
    """Packed row lengths the warm-up runs: the run's micro-batch size, and a short last micro-batch.

    Args:
        cfg: reads `use_dynamic_batch_size`, `max_tokens_per_gpu`, `micro_batch_size`, `rollout_max_prompt_len`
            and `rollout_max_response_len`.
        hidden_size: the decoder layer's hidden width.
        intermediate_size: its MLP width (with `hidden_size`, what sizes its activations).
        num_layers: decoder layers of the stand-in (one per kind of layer, `_stand_in_depth`).

    Returns:
        Distinct token counts, largest first; the largest is capped so that the stand-in's saved activations
        (about `2 * (10 * hidden + 3 * intermediate)` bytes a token and layer in bf16) stay within
        `ACTIVATION_BUDGET`.
    """
    per_token = 2 * (10 * hidden_size + 3 * intermediate_size) * max(num_layers, 1)
    cap = max(_SMALL, ACTIVATION_BUDGET // max(per_token, 1))
    if cfg.use_dynamic_batch_size and cfg.max_tokens_per_gpu:
        big = int(cfg.max_tokens_per_gpu)
    else:
        big = cfg.micro_batch_size * ((cfg.rollout_max_prompt_len or 512) + (cfg.rollout_max_response_len or 512))
    big = min(big, cap)
    return sorted({big, min(big, _SMALL)}, reverse=True)


def _lock_path() -> pathlib.Path:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    folder = pathlib.Path(cache_dir())
    folder.mkdir(parents=True, exist_ok=True)
    return folder / _LOCK_NAME


def _trained_config(cfg: SlimeArgs) -> Any:
    from transformers import AutoConfig

    from slime_core.fp8 import trainer_weights_dir

    return AutoConfig.from_pretrained(trainer_weights_dir(cfg.hf_checkpoint, cfg.ref_load))


@dataclasses.dataclass
class CompileWarmUp:
    """A running warm-up process (`start_compile_warm_up`).

    Before each step the rank asks `pending()`: while True the step runs under `eager()`; once False, `wait()`
    collects the outcome and the next forward loads (or compiles) the graphs.

    Attributes:
        process: the side process.
        workdir: its folder (config, stand-in checkpoint, `warmup.log`); removed by `wait`.
        owner: the open `owner.lock` of `workdir`, locked while this rank lives (`remove_orphaned_workdirs`);
            None in tests that build a handle by hand.
        defer_compile: steps may run eagerly while it compiles (False with flex attention).
        started: `time.monotonic()` at its start, or at `release` for a gated one.
        gated: the process waits for `release` before it touches the GPU.
    """

    process: subprocess.Popen
    workdir: pathlib.Path
    owner: Any = None
    defer_compile: bool = True
    started: float = dataclasses.field(default_factory=time.monotonic)
    gated: bool = False

    @property
    def gate(self) -> pathlib.Path:
        """The file whose existence lets a gated process go on to the GPU."""
        return self.workdir / _GATE

    def release(self) -> None:
        """Opens the gate of a gated warm-up (nothing for one started ungated); `DEFER_S` counts from now."""
        if self.gated:
            self.gate.touch()
            self.gated = False
            self.started = time.monotonic()

    def pending(self) -> bool:
        """Whether a step should still run eagerly.

        True while the warm-up (this rank's, or, when this one found another rank's holding the node's lock, that
        one) is still compiling, for less than `DEFER_S` since its start, and `defer_compile` is set.
        """
        if not self.defer_compile or time.monotonic() - self.started >= DEFER_S:
            return False
        rc = self.process.poll()
        if rc is None:
            return True
        return rc == ANOTHER_RUNS and _lock_held(_lock_path())

    @staticmethod
    def eager() -> contextlib.AbstractContextManager:
        """A block in which torch.compile'd code runs eagerly and compiles nothing.

        Process-wide, as dynamo's stance is; the autograd graph built inside, and so the backward, is eager too.
        """
        return torch.compiler.set_stance("force_eager")

    def _remove_workdir(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)
        if self.owner is not None:
            self.owner.close()  # releases its lock
            self.owner = None

    def wait(self, timeout_s: float = WAIT_S) -> dict[str, Any] | None:
        """Waits for the warm-up (and, if another rank's holds this node's lock, for that one) and logs the outcome.

        Never raises: a failed or late warm-up only means the first step compiles by itself.

        Returns:
            The warm-up's report (`seconds`, `compile_seconds`, `graphs`, `token_counts`), or None when it failed,
            timed out or ran in another process.
        """
        self.release()  # a gate still shut would keep it waiting until the deadline
        begun = time.monotonic()
        deadline = begun + timeout_s
        log = self.workdir / "warmup.log"
        try:
            try:
                rc = self.process.wait(timeout=max(deadline - time.monotonic(), 0.0))
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                logger.warning("compile warm-up not finished (waited %.1f s more): stopped; the step compiles what "
                               "is not in the cache yet (log: %s)", timeout_s, _tail(log))  # fmt: skip
                return None
            waited = time.monotonic() - begun
            if rc == ANOTHER_RUNS:
                waited = _wait_for_lock(_lock_path(), deadline)
                logger.info("compile warm-up: another rank's on this node %s", "finished" if waited else "is late")
                return None
            if rc != 0:
                logger.warning("compile warm-up failed (exit status %d), the first step compiles the layers itself: %s",
                               rc, _tail(log))  # fmt: skip
                return None
            report = json.loads((self.workdir / "report.json").read_text())
            phases = ", ".join(f"{name} {wall:.1f} s ({compiling:.1f} compiling)"
                               for name, (wall, compiling) in report.get("phases", {}).items())  # fmt: skip
            logger.info("compile warm-up: %d graph(s) of the model's stand-in compiled in %.1f s in the background "
                        "(packed rows of %s tokens; %.1f s on the GPU, after %.1f s of start-up and %.1f s at the "
                        "gate: %s); the next step waited %.1f s for it", report["graphs"], report["compile_seconds"],
                        report["token_counts"], report["seconds"], report.get("ready_seconds", 0.0),
                        report.get("gate_wait_seconds", 0.0), phases or "no phases", waited)  # fmt: skip
            if report.get("frames"):  # to set beside the frames a later step still compiles (backend.train's log)
                logger.info("compile warm-up frames: %s", "; ".join(report["frames"]))
            return report
        finally:
            self._remove_workdir()

    def stop(self) -> None:
        """Kills the process if it still runs (the rank shuts down first) and removes its folder."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._remove_workdir()


def _tail(log: pathlib.Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(no log: {exc})"


def _lock_held(path: pathlib.Path) -> bool:
    """Whether another process holds `path`'s lock now (non-blocking)."""
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(fh, fcntl.LOCK_UN)
        return False


def _wait_for_lock(path: pathlib.Path, deadline: float) -> bool:
    """Takes and releases `path`'s lock (the other warm-up holds it until it exits); False at the deadline."""
    with open(path, "a+") as fh:
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.5)
                continue
            fcntl.flock(fh, fcntl.LOCK_UN)
            return True


def remove_orphaned_workdirs(temp_dir: str | None = None) -> int:
    """Removes the warm-up folders whose rank died before it could remove them; returns how many.

    A live rank holds its folder's `owner.lock` (an `flock`, released by the kernel when the process dies, also
    on SIGKILL), so a folder whose lock can be taken has no owner. A folder without the lock file is one being
    created right now, or one of a version before the lock: it is left alone.

    Args:
        temp_dir: where the folders are (default: `tempfile.gettempdir()`, where `start_compile_warm_up` puts them).
    """
    removed = 0
    for folder in pathlib.Path(temp_dir or tempfile.gettempdir()).glob(WORKDIR_PREFIX + "*"):
        try:
            fh = open(folder / _OWNER)  # noqa: SIM115 - closed below, after the folder is gone
        except OSError:
            continue
        with fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its rank lives
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    if removed:
        logger.info("compile warm-up: removed %d folder(s) left by killed ranks (%s*)", removed, WORKDIR_PREFIX)
    return removed


def defers_compile(cfg: Any) -> bool:
    """Whether steps may run the compiled layers eagerly while the warm-up compiles (`CompileWarmUp.pending`).

    Not with flex attention (its eager form materializes the `[S, S]` scores), nor next to a colocated engine that
    stays resident on this GPU (`--colocate --no-offload-rollout`): eager layers keep more activations than
    compiled ones, and that memory is the engine's margin.

    Args:
        cfg: the run config; reads `attn_implementation`, `colocate`, `offload_rollout`.
    """
    from slime_train_fsdp.attention import DEFAULT_CUDA_ATTENTION, SLIME_FLEX

    resident_engine = bool(cfg.colocate) and cfg.offload_rollout is False
    return (cfg.attn_implementation or DEFAULT_CUDA_ATTENTION) != SLIME_FLEX and not resident_engine


def start_compile_warm_up(cfg: SlimeArgs, gated: bool = False) -> CompileWarmUp | None:
    """Starts the warm-up process when it can pay; returns its handle, or None when there is nothing to warm.

    `gated`: the process stops before its first GPU call until `CompileWarmUp.release()` (colocated ranks start it
    while the engines start and release it once they are up).

    Nothing starts with `--no-fsdp-compile-warmup`, when the layers are not compiled (`compiles_layers`: CPU or
    `--lora-rank` by default, `--true-on-policy-mode`), or for a vision-language checkpoint (its vision blocks are
    not compiled and its stand-in would need a vision tower). The process sees this process's environment (the same
    GPU and inductor cache directory); its world of one needs no port (an in-memory store).

    Raises:
        OSError: the process cannot be started (no such interpreter, no space for its folder).
    """
    from slime_train_fsdp.model_loading import compiles_layers
    from slime_train_fsdp.vision import is_vision_language

    if not cfg.fsdp_compile_warmup:
        return None
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    if not compiles_layers(cfg, device) or is_vision_language(_trained_config(cfg)):
        return None
    if cfg.context_parallel_size > 1:
        logger.info("compile warm-up: not with --context-parallel-size %d (its attention needs a CP group; the "
                    "stand-in runs in a world of one); the first step compiles the layers",
                    cfg.context_parallel_size)  # fmt: skip
        return None
    remove_orphaned_workdirs()
    workdir = pathlib.Path(tempfile.mkdtemp(prefix=WORKDIR_PREFIX))
    owner = open(workdir / _OWNER, "w")  # noqa: SIM115 - held (locked) for as long as the warm-up's folder exists
    fcntl.flock(owner, fcntl.LOCK_EX)
    (workdir / "args.json").write_text(json.dumps(cfg.to_dict()))
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "SLIME_WARMUP_PARENT": str(os.getpid())}
    if gated:
        env["SLIME_WARMUP_GATE"] = str(workdir / _GATE)
    with open(workdir / "warmup.log", "wb") as log:
        process = subprocess.Popen([sys.executable, "-m", "slime_train_fsdp.compile_warmup", str(workdir)], env=env,
                                   stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)  # fmt: skip
    logger.info("compile warm-up started (pid %d): a stand-in of the model's decoder layers compiles in the "
                "background%s", process.pid, " once the engines are up" if gated else "")  # fmt: skip
    return CompileWarmUp(process=process, workdir=workdir, owner=owner, defer_compile=defers_compile(cfg), gated=gated)


def _wait_at_gate() -> float:
    """In the process: waits for the gate file `SLIME_WARMUP_GATE` names (none: no wait); returns the seconds waited.

    The rank that started the process kills it if it dies (`_die_with_parent`), so the wait needs no deadline.
    """
    gate = os.environ.get("SLIME_WARMUP_GATE")
    begun = time.monotonic()
    while gate and not os.path.exists(gate):
        time.sleep(_GATE_POLL_S)
    return time.monotonic() - begun


def _stand_in_depth(layer_types: list[str] | None) -> int:
    """Layers the stand-in keeps: up to the first layer of each kind in `layer_types` (one without a list).

    A layer's kind (`sliding_attention`, `full_attention`, `linear_attention`, ...) changes its graph, so a model
    that mixes kinds needs one layer of each in the stand-in, or its first step compiles the missing kinds.
    """
    if not layer_types:
        return 1
    return max(layer_types.index(kind) for kind in set(layer_types)) + 1


def _write_stand_in(source_config: Any, dtype: torch.dtype | None, dest: pathlib.Path) -> Any:
    """A `_VOCAB`-token copy of `source_config` with random weights and one layer of each kind, saved as HF."""
    from transformers import AutoModelForCausalLM

    config = source_config.__class__.from_dict(source_config.to_dict())
    types = list(getattr(config, "layer_types", None) or [])
    config.num_hidden_layers = _stand_in_depth(types)
    if types:
        config.layer_types = types[: config.num_hidden_layers]
    config.vocab_size = _VOCAB
    for key in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value >= _VOCAB:
            setattr(config, key, 0)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.bfloat16)
    model.save_pretrained(dest, safe_serialization=True)
    return config


def _dummy_batch(token_counts: list[int]) -> Any:
    """One training step of packed rows of `token_counts` tokens (sequences of `_SEQ_LEN`, half response)."""
    from slime_core.batch import RolloutBatch

    g = torch.Generator().manual_seed(0)
    tokens, responses, micro_batches = [], [], []
    for total in token_counts:
        ids = []
        while total > 0:
            length = min(_SEQ_LEN, total)
            tokens.append(torch.randint(0, _VOCAB, (length,), generator=g))
            responses.append(max(length // 2, 1) if length > 1 else 0)
            ids.append(len(tokens) - 1)
            total -= length
        micro_batches.append(ids)
    masks = [torch.ones(r) for r in responses]
    n = len(tokens)
    return RolloutBatch(
        tokens=tokens, response_lengths=responses, loss_masks=masks, rewards=[0.0] * n, raw_rewards=[0.0] * n,
        loss_denominators=[max(float(m.sum()), 1.0) for m in masks], micro_batches=[micro_batches],
        sample_indices=list(range(n)), step_sample_counts=[n], step_token_counts=[float(sum(responses))],
    )  # fmt: skip


def run_warm_up(cfg: SlimeArgs, workdir: pathlib.Path) -> dict[str, Any]:
    """The warm-up itself (in the side process; it joins a world of one through an in-memory store).

    The stand-in's layers run with the log-prob head uncompiled (its graphs at the stand-in's vocabulary would
    never be used), then `warm_up_head` compiles the head at the trained model's vocabulary.

    A gated process (`SLIME_WARMUP_GATE`) waits at the gate after its CPU-only part (imports, the stand-in
    checkpoint, the token counts) and before its first GPU call.

    Returns:
        `{"seconds" (from the gate), "compile_seconds", "graphs", "token_counts", "ready_seconds" (the CPU-only
        part), "gate_wait_seconds", "phases", "frames"}`; `frames` is `compile_stats.compiled_frames`; `phases`
        maps `process_group`, `model_init`, `log_probs` (only when `runs_no_grad_forward`), `forward_backward` and
        `head` to `[wall s, of it s in torch.compile]` (GPU work synchronized).
    """
    import torch.distributed as dist

    from slime_core.fp8 import trainer_weights_dir
    from slime_core.hf_checkpoint import source_dtype
    from slime_core.train_step import entropy_has_grad, runs_no_grad_forward
    from slime_train_fsdp.backend import FSDPTrainBackend
    from slime_train_fsdp.compile_stats import compile_seconds, compiled_frames, compiled_graphs
    from slime_train_fsdp.compile_warmup_head import warm_up_head
    from slime_train_fsdp.packing import forward_options, set_forward_options

    started = time.monotonic()
    source = trainer_weights_dir(cfg.hf_checkpoint, cfg.ref_load)
    stand_in = workdir / "stand-in"
    trained = _trained_config(cfg)
    config = _write_stand_in(trained, source_dtype(source), stand_in)
    counts = warm_up_token_counts(
        cfg, int(config.hidden_size), int(config.intermediate_size), int(config.num_hidden_layers)
    )
    ready = time.monotonic() - started
    gate_wait = _wait_at_gate()  # nothing above touched the GPU
    started = time.monotonic()
    # The layer's path as the run takes it, minus what needs real weights or rollout data.
    local = cfg.model_copy(update={"hf_checkpoint": str(stand_in), "ref_load": None, "load": None, "use_opd": False,
                                   "use_routing_replay": False, "use_rollout_routing_replay": False})  # fmt: skip
    use_cuda = torch.cuda.is_available()
    phases: dict[str, list[float]] = {}  # phase -> [wall s, of it compiling s]: where the GPU part's time goes

    @contextlib.contextmanager
    def phase(name: str) -> Iterator[None]:
        wall, compiling = time.monotonic(), compile_seconds()
        yield
        if use_cuda:
            torch.cuda.synchronize()
        phases[name] = [round(time.monotonic() - wall, 2), round(compile_seconds() - compiling, 2)]

    with phase("process_group"):
        if use_cuda:
            torch.cuda.set_device(0)
        dist.init_process_group("nccl" if use_cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with phase("model_init"):
            backend = FSDPTrainBackend()
            backend.init(local, with_ref=False)
        options = forward_options(backend.model)
        # The forward reads its options on every call: the step runs the eager head, `warm_up_head` the compiled one.
        set_forward_options(backend.model, dataclasses.replace(options, compile_head=False))
        batch = _dummy_batch(counts)
        no_grad = runs_no_grad_forward(cfg)
        if no_grad:  # else no step runs it: 10 s of compiling (qwen3-0.6b, one H100) nothing would load
            with phase("log_probs"):
                backend.compute_log_probs(batch)
        entropy_grad = entropy_has_grad(cfg)
        with phase("forward_backward"):
            backend.forward_backward(batch, 0, functools.partial(_loss_like_the_run, entropy_grad), denominator=1.0)
        with phase("head"):
            warm_up_head(options, vocab_size=int(trained.vocab_size), device=backend.device, cfg=cfg, no_grad=no_grad)
    finally:
        dist.destroy_process_group()
    return {"seconds": time.monotonic() - started, "compile_seconds": compile_seconds(),
            "graphs": compiled_graphs(), "token_counts": counts, "ready_seconds": ready,
            "gate_wait_seconds": gate_wait, "phases": phases, "frames": compiled_frames(0)}  # fmt: skip


def _loss_like_the_run(entropy_grad: bool, ids: list[int], log_probs: list[torch.Tensor], entropy: list[torch.Tensor]):
    """A loss touching the log-probs of every sample, and their entropy where the run's loss does (its graph)."""
    loss = sum(lp.sum() + (ent.sum() if entropy_grad else 0.0) for lp, ent in zip(log_probs, entropy, strict=True))
    return loss, {}


def _die_with_parent() -> None:
    """Linux: the warm-up is killed when the trainer rank that started it dies."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    parent = os.environ.get("SLIME_WARMUP_PARENT")
    if parent and os.getppid() != int(parent):
        sys.exit(1)


def main(argv: list[str] | None = None) -> int:
    """`python -m slime_train_fsdp.compile_warmup WORKDIR`: runs the warm-up of `WORKDIR/args.json`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _die_with_parent()
    workdir = pathlib.Path((argv or sys.argv[1:])[0])
    with open(_lock_path(), "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return ANOTHER_RUNS
        cfg = SlimeArgs.from_dict(json.loads((workdir / "args.json").read_text()))
        report = run_warm_up(cfg, workdir)
        (workdir / "report.json").write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
