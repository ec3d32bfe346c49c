"""`slime.backends`: the parts of the original's training-backend modules that plugins import.

Only `slime.backends.megatron_utils.loss` (the built-in TIS functions) and `slime.backends.megatron_utils.cp_utils`
(the context-parallel helpers custom TIS/MIS functions and pg-loss reducers call) exist; the backends themselves are
`slime_train_megatron` and `slime_train_fsdp`, which original plugins never import.
"""
