"""Inference engines: launching SGLang or the CPU reference engine, and the reference engine itself."""
