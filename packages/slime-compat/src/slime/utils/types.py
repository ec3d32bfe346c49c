"""`slime.utils.types`: the `Sample` record plugins build and receive (original module path).

`Sample` is `slime_core.sample.Sample` itself, so samples a plugin creates and samples the framework
hands out are one class. It has the original's fields, `Sample.Status`, `get_reward_value(args)` and
`append_response_tokens(args, tokens=..., log_probs=..., trainable=..., meta_info=...)`.
"""

from slime_core.sample import Sample

__all__ = ["Sample"]
