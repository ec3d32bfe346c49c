"""The rollout-manager actor: engines, data source, rollout function, samples → per-DP-rank batches.

One per run, on the driver's node. It launches the engines (SGLang on GPU, the reference engine on
CPU), each on the node of its rollout bundle through an engine host (`slime_app.engine_hosts`), runs the
rollout function (default or `--rollout-function-path`), writes debug dumps, converts samples to
`RolloutBatch`es split by DP rank and puts them in the object store.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import gc
import importlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import ray

from slime_app.checkpoint_shapes import read_config
from slime_app.cluster import Placement
from slime_core.config import PluginArgs, SlimeArgs
from slime_core.config.validation_fully_async import is_fully_async

logger = logging.getLogger(__name__)


def _flatten(groups: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in groups:
        if isinstance(item, list):
            out.extend(_flatten(item))
        else:
            out.append(item)
    return out


def rollout_batches(
    args: Any, samples: list[Any], *, dp_size: int, rollout_id: int, build: bool = True
) -> tuple[list[Any], dict[str, float]]:
    """`slime_core.train_data.build_rollout_batches`, with `--custom-reward-post-process-path` called once.

    The plugin is user code: it runs once per rollout in a worker thread under `--plugin-timeout-secs` (one that never
    returned stalled the run after the rollout with no word), and the reward metrics come from what it returned
    (`rollout/raw_reward`, `rollout/rewards`, `rollout/zero_std/*`, `passrate/*`:
    `slime_rollout.runtime.metrics.post_processed_reward_metrics`; the rollout's metrics leave them out, so a
    stateful plugin sees one call per rollout, not two, and a sample's reward need not be a score).

    Args:
        args: the plugin view (`slime_core.config.PluginArgs`).
        samples: the rollout's samples, flat.
        dp_size: data-parallel ranks of the trainer.
        rollout_id: named in the deadline's message.
        build: False (`--debug-rollout-only`): nothing is built and the plugin does not run (as in the original).

    Returns:
        One `RolloutBatch` per data-parallel rank (none when `build` is False), and the reward metrics when the plugin
        ran (else empty).

    Raises:
        DeadlineExceeded: the plugin ran past `--plugin-timeout-secs` (names it and the rollout).
    """
    from slime_core.train_data import build_rollout_batches, postprocess_rewards, sorted_by_index
    from slime_rollout.runtime.deadlines import call_plugin_with_deadline_sync, plugin_bounds
    from slime_rollout.runtime.metrics import post_processed_reward_metrics

    if not build:
        # As the original's RolloutManager.generate: with --debug-rollout-only it returns before converting the samples
        # to train data, so the reward post-process (a stateful plugin, maybe a remote call) never runs.
        return [], {}
    path = args.custom_reward_post_process_path
    vocab = policy_vocab_size(args.hf_checkpoint)
    if not path or not samples:
        return build_rollout_batches(args, samples, dp_size=dp_size, vocab_size=vocab), {}
    ordered = sorted_by_index(samples)  # the order build_rollout_batches trains in
    what = f"--custom-reward-post-process-path {path} (rollout {rollout_id})"
    # `source`: its return checks name the rollout as the deadline does (they run in a worker thread).
    rewards = call_plugin_with_deadline_sync(
        postprocess_rewards, args, ordered, source=what, what=what, **plugin_bounds(args)
    )
    metrics = post_processed_reward_metrics(args, ordered, rewards)
    batches = build_rollout_batches(args, ordered, dp_size=dp_size, rewards=rewards, vocab_size=vocab)
    return batches, metrics


@functools.cache
def policy_vocab_size(hf_checkpoint: str | None) -> int | None:
    """`vocab_size` of the policy's config.json (a multimodal model's `text_config`), or None where none is read.

    The rows of the token embedding, which every token id the trainer gets must index (`check_token_ids`).
    """
    if not hf_checkpoint:
        return None
    try:
        config = read_config(hf_checkpoint)
    except (OSError, ValueError) as e:  # a hub id or an unreadable file: the run's other checks name it
        logger.warning("token ids are not checked against the vocabulary: %s/config.json: %s", hf_checkpoint, e)
        return None
    for where in (config, config.get("text_config") or {}, config.get("llm_config") or {}):
        if isinstance(where, dict) and isinstance(where.get("vocab_size"), int):
            return where["vocab_size"]
    logger.warning("token ids are not checked against the vocabulary: %s/config.json has no vocab_size", hf_checkpoint)
    return None


def _data_source_call(args: Any, fn: Any, *fn_args: Any, what: str) -> Any:
    """Runs the data source's construction, `save` or `load` under `--plugin-timeout-secs` (they were unbounded).

    Raises:
        DeadlineExceeded: it ran past the deadline (names `--data-source-path` and the step).
    """
    from slime_rollout.runtime.deadlines import call_in_thread_with_deadline, plugin_bounds

    named = f"the data source's {what} (--data-source-path {args.data_source_path})"
    return call_in_thread_with_deadline(fn, *fn_args, what=named, **plugin_bounds(args))


def dp_size_of(cfg: SlimeArgs) -> int:
    """Number of data-parallel ranks of the trainer (world size over the model-parallel product TP×PP×CP).

    Raises:
        ValueError: the world size is not a multiple of TP×PP×CP.
    """
    world = cfg.actor_num_nodes * cfg.actor_num_gpus_per_node
    model_parallel = cfg.tensor_model_parallel_size * cfg.pipeline_model_parallel_size * cfg.context_parallel_size
    if world % model_parallel:
        raise ValueError(f"trainer world size {world} is not divisible by TP×PP×CP = {model_parallel}")
    return world // model_parallel


@dataclasses.dataclass(frozen=True, kw_only=True)
class EngineAddresses:
    """Where the run's engines listen, known once they run.

    Attributes:
        urls: base URL of each engine (`http://host:port`), launch order.
        router_url: base URL of the router the engines were registered with, else None.
    """

    urls: list[str]
    router_url: str | None = None


def launch_or_attach_engines(cfg: SlimeArgs, placement: Placement | None) -> tuple[Any | None, EngineAddresses]:
    """Starts the run's engines, each on its rollout bundle's node, or uses external ones (`--rollout-engine-urls`).

    `--rollout-external-engine-addrs` (original flag) arrives here as `--rollout-engine-urls`. External engines
    are used as they are: none is started, and none is stopped at the end.

    Args:
        cfg: run config; reads `rollout_engine_urls`, `rollout_num_gpus`, `rollout_num_gpus_per_engine`,
            `colocate`, `output_dir` (+ what `slime_rollout.engines.launch.EngineLauncher` reads).
        placement: the run's placement (rollout bundles and their GPUs); None: every engine on this node.

    Returns:
        The started `slime_app.engine_hosts.HostedEngines` (None for external engines) and the engines' addresses.
    """
    if cfg.rollout_engine_urls:
        logger.info("using external engines: %s", cfg.rollout_engine_urls)
        return None, EngineAddresses(urls=list(cfg.rollout_engine_urls))
    from slime_app.engine_hosts import HostedEngines, engine_sites

    bundles = placement.rollout_bundles if placement is not None else []
    gpu_ids = placement.rollout_gpu_ids if placement is not None else []
    group = placement.group if placement is not None else None
    engines = HostedEngines(cfg, engine_sites(cfg, bundles, gpu_ids), group).start()
    return engines, EngineAddresses(urls=list(engines.urls), router_url=engines.router_url)


def plugin_args(cfg: SlimeArgs, addresses: EngineAddresses) -> PluginArgs:
    """The `args` every plugin of the run gets: the config plus the engines' and the router's addresses.

    The router address (`args.sglang_router_ip` / `args.sglang_router_port`) is, in order: the router the
    engines were registered with (`--sglang-router-ip` / `--sglang-router-port`); with one engine and no
    router, that engine (original custom generate functions post to
    `http://{sglang_router_ip}:{sglang_router_port}/generate`, which an engine serves too). With several
    engines and no router it stays None: custom code should use `slime_rollout.engines.client.get_client(args)`,
    which spreads requests over the engines (or start a router with `--use-sglang-router`).

    Args:
        cfg: the run config.
        addresses: the engines' addresses (`launch_or_attach_engines`).

    Returns:
        A `PluginArgs` built once for the run: data source, rollout function, rewards and the rollout
        client all receive this object.
    """
    router_url = addresses.router_url
    urls = addresses.urls
    if router_url is None and not (cfg.sglang_router_ip or cfg.sglang_router_port):
        if len(urls) == 1:
            parsed = urllib.parse.urlsplit(urls[0])
            if parsed.hostname and parsed.port:
                router_url = f"http://{parsed.hostname}:{parsed.port}"
        elif len(urls) > 1 and cfg.custom_generate_function_path:
            logger.warning(
                "%d engines and no router: args.sglang_router_ip/port are None in %s; use "
                "slime_rollout.engines.client.get_client(args).generate(payload) or --use-sglang-router",
                len(urls),
                cfg.custom_generate_function_path,
            )
    return PluginArgs.from_config(cfg, engine_urls=urls, router_url=router_url)


def goodput_fates(samples: list[Any], batches: list[Any], metrics: dict[str, float]) -> dict[str, float]:
    """`goodput/tokens_*` of one rollout: the rollout function's buckets plus the tokens no batch took.

    A custom rollout function reports no buckets: its accepted samples then count as all that was generated.
    """
    from slime_rollout.runtime.goodput import batch_token_fates, rollout_token_fates

    out = {} if "goodput/tokens_generated" in metrics else rollout_token_fates(samples, {})
    out.update(batch_token_fates(samples, [float(sum(float(m.sum()) for m in b.loss_masks)) for b in batches]))
    return out


def check_chat_template(cfg: SlimeArgs, samples: list[Any], left: int) -> tuple[dict[str, float], int]:
    """Checks a run's first multi-turn samples against the chat template (`slime_rollout.generation.template_check`).

    Args:
        cfg: the run config (`hf_checkpoint`: the tokenizer).
        samples: this rollout's samples.
        left: samples still to check (`--check-chat-template-samples` at the start of the run).

    Returns:
        The `rollout/chat_template/*` metrics and the samples left to check; a rollout without recorded
        conversations (a single-turn run) ends the checks (0 left).
    """
    from slime_rollout.data.source import get_tokenizer
    from slime_rollout.generation.template_check import check_samples

    out = check_samples(get_tokenizer(cfg.hf_checkpoint), samples, left)
    return out, (left - int(out.get("rollout/chat_template/checked", 0)) if out else 0)


def _import_in_background(module: str) -> threading.Thread:
    """Starts importing `module` in a daemon thread; join it before importing the module where it is used.

    A failure is only logged at debug level: that later import raises it again, where the error belongs.
    """

    def load() -> None:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - raised again, in context, by the caller's own import
            logger.debug("background import of %s failed", module, exc_info=True)

    thread = threading.Thread(target=load, name=f"import-{module}", daemon=True)
    thread.start()
    return thread


@ray.remote(concurrency_groups={"control": 1, "save": 1})
class RolloutManager:
    """Owns engines, data source and the rollout function for the whole run.

    Methods in the "control" concurrency group run on their own thread, so the driver can serve engine restores
    (`slime_app.engine_faults`) while a generation runs; the driver sends the fully-async `save` through the "save"
    group (its state is read in one step of the rollout loop, so it needs no pause of the generation in flight).

    Args:
        cfg: the run config.
        placement: the run's placement group and rollout bundles (engines start on their bundles' nodes).
    """

    def __init__(self, cfg: SlimeArgs, placement: Placement | None):
        import logging as _logging

        _logging.basicConfig(level=_logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        _logging.getLogger("httpx").setLevel(_logging.WARNING)
        self.cfg = cfg
        self.placement = placement
        self.args: PluginArgs | None = None  # the plugin view, built by `start` once the engines run
        self.engines = None
        self.data_source = None
        self.offloaded = False
        self.client = None
        self.template_checks_left = cfg.check_chat_template_samples  # multi-turn samples still to check
        self.supervisor = None  # the engine health monitor (--use-fault-tolerance)
        self.disposed = False  # `dispose` ran: engines that `start` brings up afterwards are stopped at once
        self._engines_lock = threading.Lock()  # `start` (default group) and `dispose` (control group) hand engines over

    # ---- lifecycle -----------------------------------------------------------------------------

    def start(self) -> list[str]:
        """Launches (or attaches to external) engines and builds the data source; returns the engine URLs."""
        from slime_rollout.data.tokenizer import prefetch_tokenizer

        cfg = self.cfg
        no_engines = cfg.debug_train_only or cfg.load_debug_rollout_data
        if no_engines:
            addresses = EngineAddresses(urls=[])
        else:
            # The data source and the rollout need the tokenizer and the rollout modules (torch: ~2 s): their imports
            # and the tokenizer's load overlap the engines' start instead of coming before or after it (the trainer's
            # model load and compile warm-up wait for this method).
            prefetch = prefetch_tokenizer(cfg.hf_checkpoint) if cfg.hf_checkpoint else None
            rollout_modules = _import_in_background("slime_rollout.generation.rollout")
            engines, addresses = launch_or_attach_engines(cfg, self.placement)
            with self._engines_lock:
                self.engines, disposed = engines, self.disposed
            if disposed:  # the run ended while they started (Ctrl-C during a long engine start)
                self.dispose()
                return []
            rollout_modules.join()
            if prefetch is not None:
                prefetch.join()
        from slime_rollout.engines.client import get_client
        from slime_rollout.engines.plugin_http import init_http_client
        from slime_rollout.generation.rollout import create_data_source

        self.args = plugin_args(cfg, addresses)
        init_http_client(self.args)  # plugins' `post` (slime.utils.http_utils): pool size and timeout of this run
        if cfg.prompt_data or cfg.data_source_path:
            self.data_source = _data_source_call(self.args, create_data_source, self.args, what="construction")
        if no_engines:
            return []
        self.client = get_client(self.args)
        logger.info("engines up: %s", addresses.urls)
        if cfg.use_fault_tolerance:
            self._supervise()
        return list(addresses.urls)

    def _supervise(self) -> None:
        from slime_app.engine_faults import EngineSupervisor

        if self.engines is None:
            logger.warning("--use-fault-tolerance: external engines (--rollout-engine-urls) are not restarted by slime")
            return
        needs_weights = not self.cfg.debug_rollout_only
        self.supervisor = EngineSupervisor(self.cfg, self.engines, self.client, needs_weights=needs_weights)
        logger.info(
            "engine health monitor: every %.0fs, timeout %.0fs, first wait %.0fs",
            self.cfg.rollout_health_check_interval,
            self.cfg.rollout_health_check_timeout,
            self.cfg.rollout_health_check_first_wait,
        )

    @ray.method(concurrency_group="control")
    def dispose(self) -> None:
        """Stops the fully-async producer, the health monitor, the engines and the reward grading pool.

        On the "control" thread: the driver's teardown after Ctrl-C or a failure must not queue behind a generation
        or an engine start in flight (it waited for them, up to its 60 s limit, then logged a traceback). A generation
        in flight then fails on the stopped engines; its result is not awaited. Engines that `start` brings up after
        this are stopped as soon as they are up.
        """
        with self._engines_lock:
            self.disposed = True
        if is_fully_async(self.cfg):
            from slime_rollout.generation.fully_async import stop_producer

            stop_producer()  # before the engines go: its requests are aborted, not cut off
        if self.supervisor is not None:
            self.supervisor.stop()
            self.supervisor = None
        with self._engines_lock:
            engines, self.engines = self.engines, None
        if engines is not None:
            engines.shutdown()
        from slime_rollout.rewards.pool import shutdown_pool

        # Its queues' named semaphores (/dev/shm/sem.mp-*) are unlinked when the queues are collected, or by the
        # resource tracker at exit; Ray kills this process with its children, tracker included: 8 files left a run.
        shutdown_pool(wait=True)
        gc.collect()

    # ---- rollout -------------------------------------------------------------------------------

    def generate(self, rollout_id: int) -> tuple[list[ray.ObjectRef], dict[str, float]]:
        """Runs one training rollout; returns per-DP-rank batch refs and `rollout/*`, `perf/*` metrics."""
        from slime_rollout.generation.rollout import run_rollout
        from slime_rollout.runtime.metrics import throughput_metrics

        args = self.args
        t0 = time.perf_counter()
        with self._monitored():
            out = run_rollout(args, rollout_id, self.data_source, evaluation=False)
        samples = _flatten(out.samples)
        metrics = dict(out.metrics or {})
        # The rollout's whole time, as the original's (its function, dumps and plugins), and the rates the function
        # reported recomputed over that same time: they divided by its own shorter time, so rate x perf/rollout_time
        # was not the rollout's tokens. (No rate is added where it reported none: a replayed dump, a log hook's own.)
        rates = throughput_metrics(samples, time.perf_counter() - t0, self.cfg.rollout_num_gpus)
        metrics.update({k: v for k, v in rates.items() if k in metrics or k == "perf/rollout_time"})
        if self.template_checks_left > 0:
            metrics.update(self._check_chat_template(samples))
        if self.supervisor is not None:
            metrics.update(self.supervisor.metrics())
        t0 = time.perf_counter()
        # The plugin view, not the bare config: --custom-reward-post-process-path is a plugin too.
        build = not self.cfg.debug_rollout_only
        batches, reward_metrics = rollout_batches(
            args, samples, dp_size=dp_size_of(self.cfg), rollout_id=rollout_id, build=build
        )
        metrics.update(reward_metrics)
        if not build:
            return [], metrics
        metrics["perf/data_preprocess_time"] = time.perf_counter() - t0
        metrics.update(goodput_fates(samples, batches, metrics))
        return [ray.put(b) for b in batches], metrics

    def _check_chat_template(self, samples: list[Any]) -> dict[str, float]:
        metrics, self.template_checks_left = check_chat_template(self.cfg, samples, self.template_checks_left)
        return metrics

    def eval(self, rollout_id: int) -> dict[str, float]:
        """Runs the eval datasets; returns `eval/*` metrics."""
        from slime_rollout.generation.rollout import run_rollout

        t0 = time.perf_counter()
        with self._monitored():
            out = run_rollout(self.args, rollout_id, self.data_source, evaluation=True)
        metrics = dict(out.metrics or {})
        metrics["perf/eval_time"] = time.perf_counter() - t0
        return metrics

    @contextlib.contextmanager
    def _monitored(self) -> Iterator[None]:
        """Health checks run while the engines generate (not while they are idle or offloaded)."""
        if self.supervisor is None:
            yield
            return
        self.supervisor.resume()
        try:
            yield
        finally:
            self.supervisor.pause()

    # ---- engine faults: called by the driver while a generation runs ----------------------------

    @ray.method(concurrency_group="control")
    def engines_awaiting_weights(self) -> list[str]:
        """URLs of restarted engines waiting for the current weights (empty without fault tolerance)."""
        return self.supervisor.awaiting_weights() if self.supervisor is not None else []

    @ray.method(concurrency_group="control")
    def engines_restored(self, urls: list[str]) -> None:
        """The current weights reached `urls`: restarted engines among them serve again."""
        if self.supervisor is not None:
            self.supervisor.restored(urls)

    @ray.method(concurrency_group="control")
    def weights_moving(self, active: bool) -> None:
        """A weight push that pauses the engines begins (`active`) or ends: health probes hold meanwhile.

        Fully async, generation goes on around a push; a paused SGLang engine holds `/health_generate` and answers
        503 after 20 s, and requests sent meanwhile wait, so a probe then would find a healthy engine frozen.
        """
        pool = getattr(self.client, "pool", None)
        if pool is not None:
            (pool.begin_weight_move if active else pool.end_weight_move)()

    @ray.method(concurrency_group="control")
    def live_engine_urls(self) -> list[str]:
        """Engines a weight push should reach now (all engines without fault tolerance)."""
        if self.supervisor is not None:
            return self.supervisor.live_urls()
        return list(self.client.urls) if self.client is not None else []

    @ray.method(concurrency_group="control")
    def engines_failed(self, urls: list[str], reason: str) -> None:
        """A weight push could not complete on `urls`: restart them (they get the weights when back)."""
        if self.supervisor is not None:
            self.supervisor.fail(urls, reason)

    # ---- colocated memory and checkpoints ------------------------------------------------------

    def offload(self) -> None:
        """Colocated: flush caches and release engine memory while the trainer runs."""
        if self.engines is not None and not self.offloaded:
            self._broadcast("flush_cache")
            self._broadcast("release_memory_occupation")
            self.offloaded = True

    def onload(self, tags: list[str] | None = None) -> None:
        """Colocated: takes engine memory back.

        Args:
            tags: "weights" before a weight sync, then "kv_cache" and "cuda_graph"; None = everything.
        """
        if self.engines is not None and self.offloaded:
            self._broadcast("resume_memory_occupation", tags=tags)
            if tags is None or "kv_cache" in tags:
                self.offloaded = False

    def _broadcast(self, method: str, **kwargs: Any) -> None:
        """`method` on every live engine; under `--use-fault-tolerance` an unreachable one is restarted, not fatal.

        A restarted engine comes back with its memory held and waits for the current weights (`slime_app.restore`).

        Raises:
            EngineError: an engine refused the call, or (without fault tolerance) did not answer.
        """
        from slime_rollout.engines.transport import EngineError
        from slime_rollout.runtime.async_utils import run

        lost: dict[str, str] = {}
        for url, outcome in run(self.client.broadcast_settled(method, **kwargs)).items():
            if not isinstance(outcome, BaseException):
                continue
            if not (self.supervisor is not None and isinstance(outcome, EngineError) and outcome.unreachable):
                raise outcome
            lost[url] = str(outcome)
        if lost:
            logger.error("/%s: engine(s) unreachable, restarting them: %s", method, "; ".join(lost.values()))
            self.supervisor.fail(list(lost), f"/{method} failed: engine unreachable")

    def save(self, rollout_id: int) -> None:
        """Saves the data-source cursor next to the checkpoint (fully async: with the producer's held groups)."""
        if self.data_source is None:
            return
        if is_fully_async(self.cfg):
            from slime_rollout.generation.fully_async import save_state

            _data_source_call(self.args, save_state, self.args, self.data_source, rollout_id, what="save")
        else:
            _data_source_call(self.args, self.data_source.save, rollout_id, what="save")

    def load(self, rollout_id: int) -> None:
        """Restores the data-source cursor saved at `rollout_id` and a fully-async checkpoint's held groups.

        Fully async, the producer generates the held groups first; another rollout function gets them in the data
        source's buffer (`load_state_into_buffer`).
        """
        if self.data_source is not None:
            _data_source_call(self.args, self.data_source.load, rollout_id, what="load")
            from slime_rollout.generation.fully_async import load_state, load_state_into_buffer

            if is_fully_async(self.cfg):
                load_state(self.args, rollout_id)
            else:  # a fully-async checkpoint's held groups: their prompts are drawn, the cursor is past them
                load_state_into_buffer(self.args, self.data_source, rollout_id)
