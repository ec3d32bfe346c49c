"""`slime.backends.megatron_utils`: the plugin-facing modules `loss` and `cp_utils` (see `slime.backends`)."""
