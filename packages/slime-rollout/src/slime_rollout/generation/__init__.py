"""Generation: one sample through an engine, one group through generate -> reward, and the rollout loops.

Modules, from one sample up: `seeds`, `top_p_replay`, `generate` (the default generate function), `multi_turn`
(tool-calling over a `slime_envs` env) with `template_check`, `opd` (teacher scores), `filters` (dynamic sampling),
`group_rollout` (one prompt group), `rollout` (the training rollout), `eval` (eval rollouts). What a rollout
function returns is `slime_rollout.base_types`.
"""
