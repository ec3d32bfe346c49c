"""Cross-flag reward rules (slime_core.config.reward_checks): a remote `--rm-type` needs `--rm-url`."""

import pytest

from slime_core.config import ConfigError, SlimeArgs


def make(**overrides):
    return SlimeArgs.from_dict({"rollout_batch_size": 4, "num_rollout": 3, **overrides})


@pytest.mark.parametrize("rm_type", ["remote_rm", "boxed_remote_rm"])
def test_a_remote_reward_type_without_a_url_is_one_error_naming_both_flags(rm_type):
    """Hostile repro: `--rm-type remote_rm` without `--rm-url` passed --dry-run and died at the first reward."""
    with pytest.raises(ConfigError) as info:
        make(rm_type=rm_type)
    assert str(info.value) == (
        f"--rm-type {rm_type} posts each response to a reward server, but --rm-url is not set: give "
        "--rm-url http://host:port/path (or score with --custom-rm-path)"
    )
    with pytest.raises(ConfigError, match="--rm-url is not set"):
        make(rm_type=rm_type, rm_url="")


def test_a_url_or_a_custom_reward_function_satisfies_it_and_local_types_need_none():
    assert make(rm_type="remote_rm", rm_url="http://127.0.0.1:8000/score").rm_url == "http://127.0.0.1:8000/score"
    assert make(rm_type="boxed_remote_rm", custom_rm_path="my_pkg.reward").custom_rm_path == "my_pkg.reward"
    assert make(rm_type="math").rm_url is None
