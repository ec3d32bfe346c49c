"""`python -m slime_core.config [FLAGS]`: validates a command line / YAML config; `--help` lists every flag."""

from slime_core.config.cli import parse_args

if __name__ == "__main__":
    parse_args()
