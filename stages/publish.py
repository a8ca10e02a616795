"""Publish models/final to the Hugging Face Hub (not a DVC stage: it has side effects).

python -m stages.publish --repo-id ORG/NAME [--dry-run] [--out publish/] [--public]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from sqlrl.publish import PublishError, push, stage_folder
from stages import run_stage

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m stages.publish", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--repo-id", required=True, help="ORG/NAME on the Hub")
    parser.add_argument("--model", default="models/final", type=Path)
    parser.add_argument("--out", default="publish", type=Path, help="folder to stage into")
    parser.add_argument("--dry-run", action="store_true", help="write the folder, push nothing")
    parser.add_argument("--public", action="store_true", help="create a public repo")
    args = parser.parse_args(argv)
    if not REPO_ID.match(args.repo_id):
        parser.error(f"--repo-id must look like ORG/NAME, got {args.repo_id!r}")
    try:
        folder = stage_folder(args.model, args.out, args.repo_id)
        if args.dry_run:
            print(f"publish: dry run, folder written to {folder} (model card: {folder}/README.md)")
            return 0
        print(f"publish: pushed {push(folder, args.repo_id, private=not args.public)}")
    except PublishError as exc:
        print(f"publish: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run_stage("publish", main))
