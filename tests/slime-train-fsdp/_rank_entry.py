"""One rank of `_launch.RankLauncher.forked`, run by `runpy.run_path` in a process forked from the forkserver.

The launcher passes these globals: `WORKER` (worker module path), `SCENARIO`, `OUT`, `CKPT`, `RANK`, `ENV` (the
test process's environment plus the rank's `RANK`/`WORLD_SIZE`/`MASTER_*`) and `CWD`. The forkserver was started
once, earlier, so the environment and working directory it had then are replaced by the test's current ones.
"""

import importlib.util
import os
import pathlib
import traceback

import torch

os.environ.clear()
os.environ.update(ENV)  # noqa: F821 (given by the launcher)
os.chdir(CWD)  # noqa: F821
torch.set_num_threads(1)
_out = pathlib.Path(OUT)  # noqa: F821
try:
    # A fresh copy of the worker module per rank: a scenario starts from the module's initial state.
    _spec = importlib.util.spec_from_file_location(f"slime_fsdp_test_{pathlib.Path(WORKER).stem}", WORKER)  # noqa: F821
    _worker = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_worker)
    _worker.run(SCENARIO, _out, CKPT)  # noqa: F821
except BaseException:
    (_out / f"rank{RANK}.err").write_text(traceback.format_exc())  # noqa: F821
    raise
