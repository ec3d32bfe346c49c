r"""Math grading in the worker pool (`--rm-num-workers`): verdicts equal to inline grading, bounded time on
pathological answers from main and non-main threads, an event loop that keeps running, stuck and crashed
workers replaced.

One pool (2 workers) is shared by the module and shut down at its end; tests that kill it on purpose
leave a fresh one behind for the next.
"""

import asyncio
import json
import logging
import os
import signal
import threading
import time
from concurrent.futures.process import BrokenProcessPool

import pytest

from slime_core.config import PluginArgs, SlimeArgs
from slime_core.sample import Sample
from slime_rollout.rewards import async_rm, batched_async_rm, pool, rule_based_reward
from slime_rollout.rewards import math as math_rewards
from slime_rollout.rewards.math_utils import grade_fast, symbolic_equal_with_timeout

NUM_WORKERS = 2
PATHOLOGICAL = r"9^{9^{9^{9}}}"  # math-verify / sympy try to evaluate the tower: minutes, unbounded memory
# Passes the guards but keeps sympy busy (pure Python) for far longer than any budget here (over 30 s unbounded
# here; ^{200} took only ~1.5 s, and sympy's cache of a stopped attempt let a repeat finish within a 1 s budget).
SLOW = ("(x+1)^{3000}", "(x+2)^{3000}")
SLOW_OTHER = ("(x+3)^{3000}", "(x+4)^{3000}")  # a second, uncached pair for a second stopped attempt

pytestmark = pytest.mark.slow  # multi-process: a pool of grading worker processes


@pytest.fixture(scope="module", autouse=True)
def grading_pool():
    """The process-wide pool, killed after the module (a later module gets a fresh one)."""
    yield
    pool.shutdown_pool()


@pytest.fixture
def short_budget(monkeypatch):
    # A 2 s worker budget keeps the pathological cases short; the default (10 s) bounds them the same way.
    monkeypatch.setattr(math_rewards, "WORKER_TIMEOUT_S", 2)


def _args(num_workers=NUM_WORKERS, rm_type="math"):
    fields = {"rollout_batch_size": 1, "num_rollout": 1, "rm_type": rm_type, "rm_num_workers": num_workers}
    return PluginArgs.from_config(SlimeArgs.from_dict(fields))


def _gsm8k_answers(fixtures_dir) -> list[tuple[str, int]]:
    with open(fixtures_dir / "gsm8k" / "test-50.jsonl") as f:
        rows = [json.loads(line) for line in f]
    # An independent parse of each label: the integer after the last '####'.
    return [(row["answer"], int(row["answer"].split("####")[-1].strip().replace(",", ""))) for row in rows]


class _Heartbeat:
    """Counts how often a coroutine gets to run (every `period_s`) while the block awaits something else."""

    def __init__(self, period_s: float):
        self.period_s, self.ticks, self._task = period_s, 0, None

    async def _beat(self):
        while True:
            await asyncio.sleep(self.period_s)
            self.ticks += 1

    async def __aenter__(self):
        self._task = asyncio.create_task(self._beat())
        await asyncio.sleep(0)  # let it start
        return self

    async def __aexit__(self, *exc):
        self._task.cancel()


def _run_in_thread_loop(coro_fn):
    """Runs `coro_fn()` on a fresh event loop in a non-main thread, like the rollout; returns its result."""
    out = {}

    def target():
        try:
            out["result"] = asyncio.run(coro_fn())
        except BaseException as e:  # surfaced in the test thread below
            out["error"] = e

    thread = threading.Thread(target=target, name="rollout-loop")
    thread.start()
    thread.join()
    if "error" in out:
        raise out["error"]
    return out["result"]


def test_symbolic_check_has_a_budget_on_any_thread():
    # What the workers and the inline path run: guards against unbounded C work, a wall-clock budget on the rest.
    # No signal is used: SIGALRM's handler and timer (pytest-timeout's, if any) are left alone.
    handler_before = signal.getsignal(signal.SIGALRM)
    assert symbolic_equal_with_timeout(r"\frac{1}{\sqrt{2}}", r"\frac{\sqrt{2}}{2}", 5) is True
    start = time.monotonic()
    assert symbolic_equal_with_timeout("5", PATHOLOGICAL, 5) is None  # refused before any evaluation
    assert time.monotonic() - start < 4.0  # well inside the 5 s budget (a check of milliseconds; a loaded machine)
    for thread in ("main", "background"):
        start = time.monotonic()
        if thread == "main":
            verdict = symbolic_equal_with_timeout(*SLOW, 1)
        else:
            verdict = _run_in_thread_loop(lambda: asyncio.to_thread(symbolic_equal_with_timeout, *SLOW_OTHER, 1))
        elapsed = time.monotonic() - start
        assert verdict is None and elapsed < 3.0, (thread, elapsed)  # 1 s budget, stopped at its next call
    assert signal.getsignal(signal.SIGALRM) is handler_before


async def test_pool_and_inline_agree_on_gsm8k_symbolic_forms(fixtures_dir):
    responses, labels, expected = [], [], []
    for label, answer in _gsm8k_answers(fixtures_dir):
        # `(answer-1)+1` is right and `answer+1` wrong; neither is a plain number, so both go to the pool.
        for pred, value in ((f"{answer - 1}+1", 1.0), (f"{answer}+1", 0.0)):
            assert grade_fast(pred, str(answer))[0] is None, pred
            responses.append(f"So the total is \\boxed{{{pred}}}.")
            labels.append(label)
            expected.append(value)
    samples = [Sample(response=r, label=lab, index=i) for i, (r, lab) in enumerate(zip(responses, labels, strict=True))]
    pooled = await batched_async_rm(_args(), samples)
    inline = [rule_based_reward("math", r, lab) for r, lab in zip(responses, labels, strict=True)]
    assert pooled == expected
    assert inline == expected


@pytest.mark.parametrize(
    ("response", "label", "expected"),
    [
        (r"\boxed{\frac{1}{2}}", "0.5", 1.0),  # exact-number fast path
        (r"\boxed{0.5}", r"\frac{1}{2}", 1.0),
        (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}", 1.0),
        (r"\boxed{\sqrt{8}}", r"2\sqrt{2}", 1.0),
        (r"\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
        (r"\boxed{\pi/2}", r"\frac{\pi}{2}", 1.0),
        (r"\boxed{2\pi}", "6.28", 0.0),
        (r"\boxed{\{2,1\}}", r"\{1,2\}", 1.0),  # sets: math-verify
        (r"\boxed{\{1,2,3\}}", r"\{1,2\}", 0.0),
        (r"\boxed{(1,2)}", "(1,2]", 0.0),  # intervals: math-verify
        (r"\boxed{[3,4)\cup(1,2]}", r"(1,2]\cup[3,4)", 1.0),
        (r"\boxed{(-\infty,3)}", "x<3", 1.0),
        (r"\boxed{\sqrt{324}}", "#### 18", 1.0),
        ("no box, 18", "18", 0.0),
    ],
)
async def test_pool_and_inline_agree_on_formats(response, label, expected):
    sample = Sample(response=response, label=label, index=0)
    assert await async_rm(_args(), sample) == expected
    assert await async_rm(_args(num_workers=0), sample) == expected
    assert rule_based_reward("math", response, label) == expected


async def test_deepscaler_and_boxed_math_through_the_pool():
    sample = Sample(response=r"<think>\boxed{1}</think> so \boxed{\frac{\sqrt{2}}{2}}", label=r"\frac{1}{\sqrt{2}}")
    assert await async_rm(_args(rm_type="deepscaler"), sample) == 1.0
    assert await async_rm(_args(rm_type="deepscaler"), Sample(response=r"\boxed{1}", label="1")) == 0.0  # no marker
    assert await async_rm(_args(rm_type="boxed_math"), Sample(response=r"\boxed{\sqrt{8}}", label=r"2\sqrt{2}")) == 1.0


async def test_zero_workers_grades_inline_without_the_pool(monkeypatch):
    async def no_pool(*args, **kwargs):
        raise AssertionError("--rm-num-workers 0 must not use the pool")

    monkeypatch.setattr(pool, "run_in_pool", no_pool)
    cases = [(r"\boxed{\sqrt{8}}", r"2\sqrt{2}", 1.0), (r"\boxed{(1,2)}", "(1,2]", 0.0), (r"\boxed{7}", "7", 1.0)]
    for response, label, expected in cases:
        sample = Sample(response=response, label=label)
        assert await async_rm(_args(num_workers=0), sample) == expected
        assert rule_based_reward("math", response, label) == expected
    # dapo is string work and always inline.
    dapo = await async_rm(_args(rm_type="dapo"), Sample(response="Answer: 18", label="18"))
    assert dapo == {"score": 1.0, "acc": True, "pred": "18"}


@pytest.mark.timeout(120)
async def test_pathological_answer_on_the_main_thread_is_wrong_not_a_hang(short_budget, caplog):
    caplog.set_level(logging.WARNING, logger="slime_rollout.rewards.math")
    long_tower = PATHOLOGICAL + "+x" * 120  # 253 characters: the warning shows its repr cut to 200 ("..." included)
    for num_workers in (NUM_WORKERS, 0):
        caplog.clear()
        start = time.monotonic()
        # The label names x too, so the check reaches the symbolic step (an answer naming other variables than
        # the label's is wrong without it).
        reward = await async_rm(_args(num_workers), Sample(response=f"\\boxed{{{long_tower}}}", label="5x", index=7))
        assert reward == 0.0 and time.monotonic() - start < 30
        warnings = [r for r in caplog.records if r.name == "slime_rollout.rewards.math"]
        assert len(warnings) == 1
        message = warnings[0].getMessage()
        assert "sample 7" in message and "'" + long_tower[:196] + "..." in message and long_tower not in message


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [NUM_WORKERS, 0])
def test_slow_and_pathological_answers_on_a_background_loop_end_within_budget(short_budget, num_workers):
    # The rollout's loop runs in a non-main thread, where SIGALRM does not work. Inline (--rm-num-workers 0) the
    # budget still holds; in the pool the loop also keeps running meanwhile.
    beat = _Heartbeat(period_s=0.01)

    async def grade_with_heartbeat():
        async with beat:
            return await batched_async_rm(
                _args(num_workers),
                [
                    Sample(response=f"\\boxed{{{PATHOLOGICAL}}}", label="5", index=0),
                    Sample(response=r"\boxed{(x+1)^{100000}}", label=r"(x+1)^{99999}", index=1),
                    Sample(response=f"\\boxed{{{SLOW[1]}}}", label=SLOW[0], index=2),
                    Sample(response="\\boxed{" + "1+" * 500_000 + "1}", label="7", index=3),  # a 1 MB answer
                    Sample(response=r"\boxed{\sqrt{8}}", label=r"2\sqrt{2}", index=4),
                ],
            )

    start = time.monotonic()
    assert _run_in_thread_loop(grade_with_heartbeat) == [0.0, 0.0, 0.0, 0.0, 1.0]
    # One slow grading at a 2 s budget (+ worker start-up in the pool); never minutes.
    assert time.monotonic() - start < 60
    if num_workers:
        # The slow grading took >= 2 s during which a 10 ms heartbeat ran freely (inline it cannot: see below).
        assert beat.ticks >= 20


async def test_inline_grading_blocks_the_loop():
    # Contrast for the heartbeat test: with --rm-num-workers 0 the loop cannot run while sympy works.
    beat = _Heartbeat(period_s=0)
    async with beat:
        before = beat.ticks
        reward = await async_rm(_args(num_workers=0), Sample(response=r"\boxed{x^2+2x+1}", label="(x+1)^2"))
        during = beat.ticks - before
    assert reward == 1.0 and during == 0


@pytest.mark.slow  # starts, kills or replaces pool worker processes: the full CI pass runs it, not the isolation pass
@pytest.mark.timeout(120)
async def test_stuck_worker_past_the_deadline_is_replaced_and_bystanders_are_retried():
    # `time.sleep` stands in for a hang in C code that SIGALRM cannot interrupt (no alarm is set here).
    await pool.run_in_pool(time.sleep, 0, num_workers=NUM_WORKERS)  # a warm pool
    generation = pool.pool_generation()
    bystander = asyncio.create_task(pool.run_in_pool(time.sleep, 2, num_workers=NUM_WORKERS))
    await asyncio.sleep(0)
    with pytest.raises(TimeoutError, match="deadline"):
        await pool.run_in_pool(time.sleep, 600, num_workers=NUM_WORKERS, deadline_s=0.5)
    # The bystander (2 s into a 2 s sleep at most) had its worker killed with the pool: without the retry
    # on the fresh pool it would raise BrokenProcessPool.
    assert await bystander is None
    assert await async_rm(_args(), Sample(response=r"\boxed{\sqrt{8}}", label=r"2\sqrt{2}")) == 1.0
    assert pool.pool_generation() == generation + 1  # exactly one replacement


@pytest.mark.slow  # starts, kills or replaces pool worker processes: the full CI pass runs it, not the isolation pass
@pytest.mark.timeout(120)
async def test_crashing_worker_raises_after_one_retry_and_the_pool_recovers(caplog):
    caplog.set_level(logging.WARNING, logger="slime_rollout.rewards.pool")
    assert await pool.run_in_pool(abs, -1, num_workers=NUM_WORKERS) == 1  # a live pool
    generation = pool.pool_generation()
    with pytest.raises(BrokenProcessPool, match="broke twice"):
        await pool.run_in_pool(os._exit, 3, num_workers=NUM_WORKERS)
    # The live pool broke, the retry ran on one new pool, which broke too: both were retired.
    assert pool.pool_generation() == generation + 1
    assert sum("retiring" in r.getMessage() for r in caplog.records) == 2
    assert await pool.run_in_pool(abs, -4, num_workers=NUM_WORKERS) == 4
    with pytest.raises(ValueError, match="--rm-num-workers"):
        await pool.run_in_pool(abs, -4, num_workers=0)


@pytest.mark.slow  # starts, kills or replaces pool worker processes: the full CI pass runs it, not the isolation pass
@pytest.mark.timeout(120)
async def test_async_rm_past_the_parent_deadline_is_wrong_and_warns_once(monkeypatch, caplog):
    # The worker budget is longer than the deadline, so only the parent side can end this call.
    monkeypatch.setattr(math_rewards, "WORKER_TIMEOUT_S", 60)
    monkeypatch.setattr(pool, "DEFAULT_DEADLINE_S", 1.0)
    caplog.set_level(logging.WARNING, logger="slime_rollout.rewards.math")
    reward = await async_rm(_args(), Sample(response=f"\\boxed{{{SLOW[1]}}}", label=SLOW[0], index=11))
    assert reward == 0.0
    warnings = [r.getMessage() for r in caplog.records if r.name == "slime_rollout.rewards.math"]
    assert len(warnings) == 1
    assert "sample 11" in warnings[0] and "TimeoutError" in warnings[0] and SLOW[1] in warnings[0]
    monkeypatch.setattr(pool, "DEFAULT_DEADLINE_S", 60.0)
    assert await async_rm(_args(), Sample(response=r"\boxed{\sqrt{8}}", label=r"2\sqrt{2}")) == 1.0


def test_rm_num_workers_flag():
    from slime_core.config import ConfigError, parse_args

    base = ["--rollout-batch-size", "4", "--num-rollout", "1"]
    assert parse_args(base).rm_num_workers == 4
    assert parse_args([*base, "--rm-num-workers", "0"]).rm_num_workers == 0
    with pytest.raises(ConfigError, match="--rm-num-workers"):
        parse_args([*base, "--rm-num-workers", "-1"])


async def test_a_pool_that_never_worked_falls_back_to_inline_grading(monkeypatch, caplog):
    """Workers that die before their first verdict (e.g. an unguarded main module re-imported by spawn) must
    not turn every symbolic reward into 0.0: grading goes inline, with one error."""

    async def broken(*a, **k):
        raise BrokenProcessPool("workers died at start-up")

    monkeypatch.setattr(pool, "run_in_pool", broken)
    monkeypatch.setattr(pool, "has_returned", lambda: False)
    monkeypatch.setattr(math_rewards, "_pool_unusable", threading.Event())
    with caplog.at_level(logging.ERROR, logger="slime_rollout.rewards.math"):
        # Both need the symbolic check (no exact string or number match).
        right = await math_rewards.math_reward_async("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", num_workers=2)
        wrong = await math_rewards.math_reward_async("\\boxed{\\sqrt{7}}", "2\\sqrt{2}", num_workers=2)
    assert (right, wrong) == (1.0, 0.0)
    assert [r.levelno for r in caplog.records].count(logging.ERROR) == 1 and "inline" in caplog.text


async def test_a_crash_after_the_pool_worked_counts_that_answer_wrong(monkeypatch, caplog):
    async def broken(*a, **k):
        raise BrokenProcessPool("this input killed its worker")

    monkeypatch.setattr(pool, "run_in_pool", broken)
    monkeypatch.setattr(pool, "has_returned", lambda: True)
    monkeypatch.setattr(math_rewards, "_pool_unusable", threading.Event())
    with caplog.at_level(logging.WARNING, logger="slime_rollout.rewards.math"):
        got = await math_rewards.math_reward_async("\\boxed{\\sqrt{8}}", "2\\sqrt{2}", num_workers=2, sample_index=7)
    assert got == 0.0 and "sample 7" in caplog.text and not math_rewards._pool_unusable.is_set()


@pytest.fixture
def slow_start_up(monkeypatch, tmp_path):
    """Pool workers whose start-up takes 5 s (a loaded machine's spawn + imports), longer than the deadlines set.

    Spawned workers import the initializer by module name (tests are not importable packages here), so it lives
    in a module on a path the workers inherit.
    """
    (tmp_path / "slow_grading_start.py").write_text(
        "import time\n"
        "from slime_rollout.rewards.pool import _warm_up_worker\n\n\n"
        "def start():\n    time.sleep(5.0)\n    _warm_up_worker()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import slow_grading_start

    pool.shutdown_pool()  # a fresh pool, built with the slow start-up
    monkeypatch.setattr(pool, "_warm_up_worker", slow_grading_start.start)
    monkeypatch.setattr(math_rewards, "_pool_unusable", threading.Event())
    yield
    pool.shutdown_pool()  # the next test gets a pool with the normal start-up


@pytest.mark.slow  # starts, kills or replaces pool worker processes: the full CI pass runs it, not the isolation pass
@pytest.mark.timeout(120)
async def test_slow_worker_start_up_does_not_count_against_the_grading_deadline(slow_start_up, monkeypatch, caplog):
    """A fresh pool whose workers take 5 s to start still grades a correct answer right under a 4 s deadline:
    start-up has its own budget, and the deadline starts once every worker reported in. (With 1 s, the four warm
    checks, two queued per worker, ran past it on a loaded 2-core machine.)"""
    monkeypatch.setattr(pool, "DEFAULT_DEADLINE_S", 4.0)
    caplog.set_level(logging.WARNING)
    generation = pool.pool_generation()
    samples = [Sample(response=r"\boxed{\sqrt{8}}", label=r"2\sqrt{2}", index=i) for i in range(2 * NUM_WORKERS)]
    # Needs the symbolic check (no string or number match), so every sample goes to the pool.
    assert await batched_async_rm(_args(), samples) == [1.0] * len(samples)
    assert pool.pool_generation() == generation + 1  # one pool, never retired
    assert not math_rewards._pool_unusable.is_set()
    assert "stuck or crashed" not in caplog.text and "retiring" not in caplog.text


@pytest.mark.slow  # starts, kills or replaces pool worker processes: the full CI pass runs it, not the isolation pass
@pytest.mark.timeout(120)
async def test_a_pool_that_misses_its_start_up_budget_says_so_and_grades_inline(slow_start_up, monkeypatch, caplog):
    monkeypatch.setattr(pool, "STARTUP_DEADLINE_S", 0.5)
    with pytest.raises(pool.PoolStartupError, match=r"0 of 2 workers started within its 0.5 s start-up budget"):
        await pool.run_in_pool(abs, -1, num_workers=NUM_WORKERS)
    caplog.set_level(logging.ERROR, logger="slime_rollout.rewards.math")
    # Through the grader: the correct answer is still graded right (inline), with one error naming the cause.
    assert await async_rm(_args(), Sample(response=r"\boxed{\sqrt{8}}", label=r"2\sqrt{2}", index=3)) == 1.0
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "start-up budget" in errors[0] and "inline" in errors[0]


@pytest.mark.slow  # starts, kills or replaces pool worker processes: the full CI pass runs it, not the isolation pass
@pytest.mark.timeout(120)
async def test_a_call_cancelled_while_the_pool_starts_leaves_the_pool_usable(slow_start_up):
    """Cancelling one caller during start-up stops only its wait: the shared start-up goes on, later calls grade."""
    generation = pool.pool_generation()
    first = asyncio.create_task(pool.run_in_pool(abs, -3, num_workers=NUM_WORKERS))
    await asyncio.sleep(0.5)  # the workers take 3 s to start
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not pool._startup.cancelled()
    assert pool._startup.cancel() is False  # nobody else can cancel it either
    assert await asyncio.wait_for(pool.run_in_pool(abs, -5, num_workers=NUM_WORKERS), 60) == 5
    assert pool.pool_generation() == generation + 1  # the same pool, never retired or restarted


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, never reaped where pid 1 does not reap, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


_OWNER = """
import asyncio, os, sys, time
from slime_rollout.rewards import pool
pool._warm_up_worker = os.getpid  # no sympy imports: only the pool's life matters here
async def main():
    return {await pool.run_in_pool(os.getpid, num_workers=2) for _ in range(6)}
print(" ".join(map(str, asyncio.run(main()))), flush=True)
time.sleep(600)
"""


@pytest.mark.timeout(120)
def test_the_workers_die_with_the_process_that_owns_the_pool():
    # Issue 27: SIGKILL of the process owning the pool (the rollout manager) left its grading workers running as
    # orphans (ppid 1): a worker waits on its call queue, whose write end it holds itself, so it never saw EOF.
    import subprocess
    import sys

    owner = subprocess.Popen([sys.executable, "-c", _OWNER], stdout=subprocess.PIPE, text=True)
    try:
        workers = [int(pid) for pid in owner.stdout.readline().split()]
        assert workers and all(_alive(pid) for pid in workers), workers
    finally:
        owner.kill()
        owner.wait()
    deadline = time.monotonic() + 15  # the check runs every second
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if _alive(pid)]
    for pid in left:  # never leave them behind, whatever the verdict
        os.kill(pid, signal.SIGKILL)
    assert not left, f"grading workers {left} outlived the pool's owner"
