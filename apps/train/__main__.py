"""slime synchronous RL trainer: `uv run apps/train [FLAGS]`.

With no flags it runs the embedded CPU demo. (Not implemented yet: see issue "apps/train".)
"""

import sys

if __name__ == "__main__":
    sys.stderr.write("apps/train: not implemented yet\n")
    sys.exit(0)
