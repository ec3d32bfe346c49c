import pytest

from slime_core.config import SlimeArgs
from slime_core.param_filter import frozen_parameter_names

NAMES = ["embed.weight", "layers.0.attn.q.weight", "layers.0.mlp.up.weight", "layers.1.mlp.up.weight", "head.weight"]


# A real, validated run config; tests set fields with model_copy (no re-validation, so invalid combinations
# reach the functions' own checks).
_CONFIG = SlimeArgs.from_dict({"rollout_batch_size": 1, "num_rollout": 1})


def _args(only=None, freeze=None):
    return _CONFIG.model_copy(update=dict(only_train_params_name_list=only, freeze_params_name_list=freeze))


def test_neither_flag_freezes_nothing():
    assert frozen_parameter_names(NAMES, _args()) == set()


def test_freeze_list_freezes_matches():
    assert frozen_parameter_names(NAMES, _args(freeze=[r"\.mlp\.", "^embed"])) == {
        "embed.weight",
        "layers.0.mlp.up.weight",
        "layers.1.mlp.up.weight",
    }


def test_only_train_list_freezes_the_rest():
    # re.search: "layers\.1" matches inside the name; "head" anywhere.
    assert frozen_parameter_names(NAMES, _args(only=[r"layers\.1\.", "head"])) == {
        "embed.weight",
        "layers.0.attn.q.weight",
        "layers.0.mlp.up.weight",
    }


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (_args(freeze=["mpl"]), "--freeze-params-name-list: 'mpl' matches no parameter"),
        (_args(only=["("]), "--only-train-params-name-list: '(' is not a valid regular expression"),
        (_args(freeze=["."]), "every parameter would be frozen"),
        (_args(only=["head"], freeze=["embed"]), "mutually exclusive"),
    ],
)
def test_bad_patterns(args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        frozen_parameter_names(NAMES, args)


@pytest.mark.parametrize("flag", ["--freeze-params-name-list", "--only-train-params-name-list"])
def test_the_flags_take_no_value_as_the_original_does(flag):
    # The original's nargs="*": a launch script whose pattern variable is empty passes the bare flag. Here it was
    # "argument --freeze-params-name-list: expected at least one argument"; an empty list freezes nothing there too.
    from slime_core.config import parse_args

    cfg = parse_args(["--rollout-batch-size", "1", "--num-rollout", "1", "--n-samples-per-prompt", "2", flag])
    assert getattr(cfg, flag.removeprefix("--").replace("-", "_")) == []
    assert frozen_parameter_names(NAMES, cfg) == set()
