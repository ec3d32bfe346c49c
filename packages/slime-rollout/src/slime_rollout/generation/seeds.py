"""Per-sample sampling seeds: the same run config draws the same tokens, whatever the request order.

Every `/generate` request of the default rollout carries `sampling_params.sampling_seed`, derived from
(`--rollout-seed`, rollout id, prompt index, sample index) by a hash. The seed of a sample does not depend
on which engine serves it, when its request arrives, or whether an engine restarted and the request was sent
again, so two runs with the same flags generate the same samples. (Before, the reference engine seeded a
request from its arrival order, and SGLang samples from its own generator state.) The CPU reference engine
samples every request from a generator seeded with it; SGLang honours it under
`--sglang-enable-deterministic-inference` and otherwise ignores it.
"""

from __future__ import annotations

import hashlib

__all__ = ["SEED_MODULUS", "continuation_seed", "sample_seed"]

# SGLang hashes the seed with the token position in int64 arithmetic (`multinomial_with_seed`); a 31-bit
# seed keeps that product meaningful and fits every engine's integer field.
SEED_MODULUS = 2**31


def _hash(*parts: object) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % SEED_MODULUS


def sample_seed(
    rollout_seed: int, rollout_id: int | None, prompt_index: int | None, sample_index: int | None, *, evaluation: bool
) -> int:
    """The sampling seed of one sample.

    Args:
        rollout_seed: `--rollout-seed`.
        rollout_id: the rollout the request belongs to (a partial sample continued in a later rollout draws
            fresh tokens with that rollout's id).
        prompt_index: the sample's prompt (`Sample.group_index`, or its group's position in the rollout).
        sample_index: the sample (`Sample.index`, or its position in the group).
        evaluation: an eval rollout (eval and training draws differ even at equal ids).

    Returns:
        An integer in `[0, 2**31)`, a hash (BLAKE2b) of the arguments.
    """
    return _hash("eval" if evaluation else "train", rollout_seed, rollout_id, prompt_index, sample_index)


def continuation_seed(seed: int, num_generated: int) -> int:
    """The seed of a later request of the same sample (the next turn of a multi-turn sample).

    Args:
        seed: the sample's seed.
        num_generated: response tokens the sample already has (tells the turns apart).
    """
    return seed if num_generated == 0 else _hash(seed, num_generated)
