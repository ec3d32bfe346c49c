"""Run configuration: `SlimeArgs` (one flat pydantic model) and `parse_args` (original slime flag names).

Example:
    >>> from slime_core.config import parse_args
    >>> args = parse_args(["--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--num-rollout", "2"])
    >>> args.global_batch_size
    32
"""

from slime_core.config.args import PluginArgs, SlimeArgs, config_error_from_validation, plugin_view
from slime_core.config.base import ConfigError
from slime_core.config.cli import build_parser, load_yaml_config, parse_args
from slime_core.config.megatron_flags import MEGATRON_FLAGS

__all__ = [
    "MEGATRON_FLAGS",
    "ConfigError",
    "PluginArgs",
    "SlimeArgs",
    "build_parser",
    "config_error_from_validation",
    "load_yaml_config",
    "parse_args",
    "plugin_view",
]
