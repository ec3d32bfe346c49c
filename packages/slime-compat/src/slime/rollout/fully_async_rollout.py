"""`slime.rollout.fully_async_rollout`: the fully-async rollout (original module path).

Used as `--rollout-function-path slime.rollout.fully_async_rollout.generate_rollout_fully_async` on engines of their
own (no `--colocate`); `--max-weight-staleness` bounds how many weight versions behind a trained group may be.
The original's `AsyncRolloutWorker` is `FullyAsyncProducer` here (it runs on the rollout loop, not a thread of its own).
"""

from slime_rollout.generation.fully_async import generate_rollout_fully_async
from slime_rollout.generation.fully_async_producer import FullyAsyncProducer as AsyncRolloutWorker

__all__ = ["AsyncRolloutWorker", "generate_rollout_fully_async"]
