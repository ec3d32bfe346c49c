"""slime-train-megatron."""

__version__ = "0.1.0"
