"""CPU reference engine: an SGLang-compatible HTTP server backed by transformers (see `__main__`)."""
