"""`slime.utils.mask_utils`: loss masks of chat conversations for SFT (original module path).

`MultiTurnLossMaskGenerator(tokenizer, tokenizer_type="qwen").get_loss_mask(messages, tools)` returns
`(token_ids, loss_mask)`; see `slime_rollout.data.sft.ChatLossMask` for the supported `--loss-mask-type` values.
"""

from slime_rollout.data.sft import ChatLossMask as MultiTurnLossMaskGenerator
from slime_rollout.data.sft import response_lengths as get_response_lengths

__all__ = ["MultiTurnLossMaskGenerator", "get_response_lengths"]
