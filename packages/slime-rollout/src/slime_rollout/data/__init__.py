"""Prompt data: rows from JSONL/Parquet to `Sample`s, prompt lengths, images, and SFT conversations.

Modules: `source` (data sources, `--prompt-data`), `prompt_length` (`--rollout-max-prompt-len`), `multimodal`
(`--multimodal-keys`), `sft` (chat conversations -> token ids and loss masks, the SFT rollout).
"""
