"""`slime_core.secrets`: credentials are replaced wherever the config or an engine command line is shown or sent."""

from slime_core.config import SlimeArgs
from slime_core.secrets import REDACTED, is_secret_name, redact_argv, redact_mapping


def test_which_names_hold_a_credential():
    assert is_secret_name("--wandb-key") and is_secret_name("wandb_key")
    assert is_secret_name("--api-key") and is_secret_name("admin_api_key") and is_secret_name("--sglang-api-key")
    assert not any(is_secret_name(n) for n in ("--input-key", "label_key", "reward_key", "--max-total-tokens"))


def test_an_engine_command_line_keeps_its_flags_but_not_their_secret_values():
    argv = ["python", "-m", "sglang.launch_server", "--api-key", "sk-1", "--port", "15000", "--admin-api-key=sk-2"]
    assert redact_argv(argv) == [
        "python", "-m", "sglang.launch_server", "--api-key", REDACTED, "--port", "15000", f"--admin-api-key={REDACTED}",
    ]  # fmt: skip
    assert redact_argv(["--api-key"]) == ["--api-key"]  # a dangling flag: nothing to hide


def test_the_public_config_hides_the_wandb_key_and_pass_through_api_keys():
    cfg = SlimeArgs.from_dict(
        {
            "rollout_batch_size": 1,
            "num_rollout": 1,
            "wandb_key": "wk",
            "sglang_args": {"api_key": "sk", "chunked_prefill_size": "512"},
        }
    )
    public = cfg.to_public_dict()
    assert public["wandb_key"] == REDACTED and public["sglang_args"] == {
        "api_key": REDACTED,
        "chunked_prefill_size": "512",
    }
    assert cfg.wandb_key == "wk" and cfg.sglang_args["api_key"] == "sk"  # the run itself still has them
    assert redact_mapping({"wandb_key": None, "api_key": ""}) == {"wandb_key": None, "api_key": ""}  # unset: shown
