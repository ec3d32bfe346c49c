"""The run config the objective tests call the loss functions with: `args(**fields)` and the tolerance `ATOL`.

Shared by `test_algo_objective.py` and `test_algo_custom_tis.py`; importable as module `slime_core_objective_args`
(registered in this folder's conftest.py: pytest runs with `--import-mode=importlib`, so this folder is not on
`sys.path`).
"""

import functools

from slime_core.config import SlimeArgs

# Tolerances: the plain-Python reference runs in float64, the implementation in float32: atol 1e-5.
ATOL = 1e-5


@functools.cache
def config() -> SlimeArgs:
    """A real, validated run config; tests set fields with model_copy (no re-validation, so invalid combinations
    reach the functions' own checks). Built at first use, not when conftest.py loads this module: a package's
    isolation run loads that conftest before the root one registers the backend records validation reads."""
    return SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def args(**kw) -> SlimeArgs:
    """The objective tests' config: GRPO, PPO clip 0.2/0.28, dual clip 3, entropy 0.01, low-var KL 0.1, TIS truncate
    at 2.0, per-sample token mean; `kw` overrides any field (not re-validated)."""
    base = dict(
        advantage_estimator="grpo",
        eps_clip=0.2,
        eps_clip_high=0.28,
        eps_clip_c=3.0,
        entropy_coef=0.01,
        use_kl_loss=True,
        kl_loss_coef=0.1,
        kl_loss_type="low_var_kl",
        use_unbiased_kl=False,
        use_tis=True,
        tis_clip=2.0,
        tis_clip_low=0.0,
        tis_mode="truncate",
        calculate_per_token_loss=False,
        use_rollout_logprobs=False,
        custom_pg_loss_reducer_function_path=None,
    )
    base.update(kw)
    return config().model_copy(update=base)
