"""`slime.utils`: the plugin-facing utilities of the original (types, HTTP, misc, masks, tokenizers)."""
