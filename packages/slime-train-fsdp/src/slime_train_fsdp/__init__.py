"""slime-train-fsdp."""

__version__ = "0.1.0"
