"""slime-convert."""

__version__ = "0.1.0"
