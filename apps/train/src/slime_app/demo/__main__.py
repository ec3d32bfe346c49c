"""The embedded demo with extra flags: `uv run python -m slime_app.demo [FLAGS]` (later flags win).

E.g. LoRA RL on the demo: `uv run python -m slime_app.demo --lora-rank 8 --lora-alpha 16 --lr 4e-3
--output-dir runs/demo-lora --save runs/demo-lora/checkpoints --save-hf runs/demo-lora/hf`.
"""

import sys

from slime_app.cli import main
from slime_app.demo import default_demo_argv

if __name__ == "__main__":
    sys.exit(main(default_demo_argv() + sys.argv[1:]))
