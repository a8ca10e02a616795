"""The GPU rehearsal's entry point: `python scripts/gpu_rehearsal.py {bundle,install,run,check}`.

Its logic is the package sqlrl/train/gpu_rehearsal/ (its cli.py lists the commands and their
flags; docs/gpu-rehearsal.md is the how-to). A script, not `python -m`: the GPU machine
runs it from a copy of the working tree with the image's python3, where sqlrl is not installed,
so it puts the repo on the import path itself. It imports the standard library alone up to the
command's own work: `install` runs there before the project's packages are.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: make the sqlrl package importable
    sys.path.insert(0, str(REPO))

from sqlrl.train.gpu_rehearsal.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
