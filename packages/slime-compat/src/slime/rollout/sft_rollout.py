"""`slime.rollout.sft_rollout`: the SFT "rollout" (original module path).

Used as `--rollout-function-path slime.rollout.sft_rollout.generate_rollout` with `--loss-type sft_loss`.
"""

from slime_rollout.data.sft import generate_sft_rollout as generate_rollout

__all__ = ["generate_rollout"]
