"""Checkpoints that an interrupted training run (sft or grpo) can resume from.

A stage keeps its checkpoints outside DVC's outputs (the stage's --checkpoints folder), with a
fingerprint of what the run computes from: its params (less the settings that do not change the
result), the seed and the contents of its input files and folders. `sft.resume` / `grpo.resume`
continue from the last checkpoint only when the fingerprint is the same; any other checkpoint is
set aside and the run starts fresh.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger(__name__)

FINGERPRINT_FILE = "sqlrl_run.json"
# settings that never change what a run computes: resuming, checkpoint and log intervals, and
# where a vLLM server listens
NOT_FINGERPRINTED = (
    "resume",
    "save_steps",
    "logging_steps",
    "vllm_server_host",
    "vllm_server_port",
    "vllm_server_timeout_s",
)


def run_fingerprint(params, seed: int, inputs: Iterable[str | Path], extra=None) -> str:
    """A hash of a run's params dataclass (less NOT_FINGERPRINTED), seed, any JSON-able `extra`
    (e.g. the rows it trains on) and the bytes of each input file or folder."""
    settings = {k: v for k, v in dataclasses.asdict(params).items() if k not in NOT_FINGERPRINTED}
    digest = hashlib.sha256(
        json.dumps(
            {"params": settings, "seed": seed, "extra": extra}, sort_keys=True, default=str
        ).encode()
    )
    for root in map(Path, inputs):
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for path in files:
            digest.update(
                (path.relative_to(root) if path != root else Path(root.name)).as_posix().encode()
            )
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
    return digest.hexdigest()


def last_checkpoint(checkpoint_dir: str | Path) -> str | None:
    from transformers.trainer_utils import get_last_checkpoint

    path = Path(checkpoint_dir)
    return get_last_checkpoint(str(path)) if path.is_dir() else None


def checkpoint_to_resume(checkpoint_dir: str | Path, fingerprint: str) -> str | None:
    """The last checkpoint in checkpoint_dir when it was made by a run with this fingerprint;
    None (and a line saying why) when there is none or it belongs to another run."""
    last = last_checkpoint(checkpoint_dir)
    if last is None:
        return None
    stored = Path(checkpoint_dir) / FINGERPRINT_FILE
    made_by = json.loads(stored.read_text())["fingerprint"] if stored.is_file() else None
    if made_by != fingerprint:
        log.warning(
            "not resuming from %s: it was made with other params, seed or inputs; starting fresh",
            last,
        )
        return None
    return last


def prepare_checkpoints(
    checkpoint_dir: str | Path, fingerprint: str, resume: bool, writer: bool
) -> str | None:
    """The checkpoint to resume from (resume and the same fingerprint), else None after
    clearing checkpoint_dir; the fingerprint is stored there for the next run. Only the
    `writer` process touches the folder."""
    resume_from = checkpoint_to_resume(checkpoint_dir, fingerprint) if resume else None
    if writer:
        if resume_from is None:
            shutil.rmtree(checkpoint_dir, ignore_errors=True)
        Path(checkpoint_dir).mkdir(parents=True, exist_ok=True)
        (Path(checkpoint_dir) / FINGERPRINT_FILE).write_text(
            json.dumps({"fingerprint": fingerprint})
        )
    return resume_from


def curves_at_checkpoint(dvclive_dir: str | Path, checkpoint: str | Path) -> int:
    """Cut the DVCLive curves back to the points logged up to `checkpoint` and return how
    many that is: the trainer redoes the steps after it, and their points come again.
    (DVCLiveCallback makes one point per trainer log, and the checkpoint keeps the logs.)"""
    state = json.loads((Path(checkpoint) / "trainer_state.json").read_text())
    kept = len(state.get("log_history", []))
    for tsv in Path(dvclive_dir, "plots", "metrics").rglob("*.tsv"):
        with open(tsv, newline="", encoding="utf-8") as fh:
            rows = list(csv.DictReader(fh, delimiter="\t"))
        if not rows:
            continue
        with open(tsv, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, list(rows[0]), delimiter="\t", lineterminator=os.linesep)
            writer.writeheader()
            writer.writerows(r for r in rows if int(r["step"]) < kept)
    return kept


def dvclive_callback(dvclive_dir: str | Path, resume_from: str | None):
    """(Live, DVCLiveCallback) writing the curves to dvclive_dir: fresh curves, or on resume
    the curves cut back to the checkpoint and continued from there. Live must not rewrite
    dvc.yaml (dvcyaml=False) nor make DVC experiments."""
    from transformers.integrations import DVCLiveCallback

    from dvclive import Live

    if not resume_from:
        shutil.rmtree(dvclive_dir, ignore_errors=True)
    live = Live(str(dvclive_dir), dvcyaml=False, save_dvc_exp=False, resume=bool(resume_from))
    if resume_from:  # DVCLive would go on from its own last point, not the checkpoint's
        live.step = curves_at_checkpoint(dvclive_dir, resume_from)
    return live, DVCLiveCallback(live=live)
