"""Publishing models/final to the Hugging Face Hub with a generated model card.

Not a DVC stage: pushing is a side effect. `--dry-run` writes the folder (model, tokenizer,
README.md model card) locally and pushes nothing. The token comes from the environment
(HF_TOKEN); a missing token or an unreachable hub is a clear message, not a traceback.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import yaml

from sqlrl.benchmarks.spider import HARDNESS_LEVELS as HARDNESS
from sqlrl.errors import PipelineError
from sqlrl.eval.report import MODELS, benchmark_table, by_split


class PublishError(PipelineError, RuntimeError):
    """Publishing cannot go on; the message says what to do."""


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _pct(value) -> str:
    return "—" if value is None else f"{100 * value:.1f}"


def metrics_table(root: Path = Path(".")) -> str:
    """Markdown: EX/EM of base, SFT and GRPO on Spider dev, overall and by hardness."""
    header = "| model | EX | EM | " + " | ".join(f"EX {h}" for h in HARDNESS) + " | held-out EX |"
    lines = [header, "|" + "---|" * (4 + len(HARDNESS))]
    for name, label in MODELS.items():
        report = by_split(_read_json(root / "metrics" / f"eval_{name}.json"))
        if not report:
            continue
        dev, by = report["dev"], report["dev"].get("by_hardness", {})
        lines.append(
            f"| {label} | {_pct(dev.get('ex'))} | {_pct(dev.get('em'))} | "
            + " | ".join(_pct(by.get(h, {}).get("ex")) for h in HARDNESS)
            + f" | {_pct((report.get('heldout') or {}).get('ex'))} |"
        )
    return "\n".join(lines)


def sets_table(root: Path = Path(".")) -> str:
    """Markdown: each model's EX on every evaluation set (sqlrl.eval.report's table)."""
    return benchmark_table(
        {name: _read_json(root / "metrics" / f"eval_{name}.json") for name in MODELS}
    )


def data_version(root: Path = Path(".")) -> str:
    """The md5 of the Spider directory the model was trained on (from data/raw/spider.dvc)."""
    pointer = yaml.safe_load((root / "data" / "raw" / "spider.dvc").read_text())
    return pointer["outs"][0]["md5"]


def model_card(repo_id: str, root: Path = Path(".")) -> str:
    params = yaml.safe_load((root / "params.yaml").read_text())
    base = params["base"]
    base_model = base["model_id"] if base["source"] == "hub" else "none (trained from scratch)"
    front = {
        "license": "cc-by-sa-4.0",
        "library_name": "transformers",
        "tags": ["text-to-sql", "grpo", "trl", "spider"],
        "datasets": ["spider"],
    }
    if base["source"] == "hub":
        front["base_model"] = base["model_id"]
    return "\n".join(
        [
            "---",
            yaml.safe_dump(front, sort_keys=False).strip(),
            "---",
            "",
            f"# {repo_id}",
            "",
            "A text-to-SQL model trained by [sql-rl-pipeline]: supervised fine-tuning, then GRPO "
            "with an execution reward (1.0 when the generated SQL returns the gold result on the "
            "real SQLite database).",
            "",
            f"- Base model: {base_model}"
            + (f" @ `{base['revision']}`" if base["revision"] else ""),
            f"- Profile: `{params['profile']}`",
            f"- Data: Spider 1.0 (Yu et al., 2018; CC BY-SA 4.0), DVC md5 `{data_version(root)}`",
            f"- Schema in the prompt: `{params['prepare']['schema_format']}`",
            "",
            "## Spider dev results (%)",
            "",
            metrics_table(root),
            "",
            "EX: execution accuracy (test-suite semantics); EM: exact set match without values.",
            "Greedy decoding.",
            "",
            "## Every evaluation set (%)",
            "",
            sets_table(root),
            "",
            "Greedy decoding; in brackets, maj@k: k answers sampled at "
            f"temperature {params['eval']['temperature']}, the answer with the most votes by "
            "execution result. Spider-format sets by test-suite EX, BIRD by its own EX (result "
            "sets), each over the questions whose database was available.",
            "",
            "## Use",
            "",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            f'tok = AutoTokenizer.from_pretrained("{repo_id}")',
            f'model = AutoModelForCausalLM.from_pretrained("{repo_id}")',
            "```",
            "",
            "Prompts are chat messages (system + user with schema and question) built by "
            "`sqlrl.data.prompts.build_messages`; see the pipeline's README.",
            "",
            "## Training parameters",
            "",
            "```yaml",
            yaml.safe_dump(
                {k: params[k] for k in ("seed", "sft", "grpo")}, sort_keys=False
            ).strip(),
            "```",
            "",
        ]
    )


def stage_folder(model_dir: Path, out_dir: Path, repo_id: str, root: Path = Path(".")) -> Path:
    """The folder that would be pushed: the model files plus README.md (the card)."""
    if not (model_dir / "config.json").is_file():
        raise PublishError(f"{model_dir} holds no model: run `dvc repro merge` (or `dvc pull`)")
    shutil.rmtree(out_dir, ignore_errors=True)
    shutil.copytree(model_dir, out_dir)
    (out_dir / "README.md").write_text(model_card(repo_id, root), encoding="utf-8")
    return out_dir


def push(folder: Path, repo_id: str, private: bool = True) -> str:
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if not token:
        raise PublishError(
            "no Hugging Face token: set HF_TOKEN to a token with write access "
            "(or use --dry-run to only write the folder)"
        )
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise PublishError("HF_HUB_OFFLINE=1 is set: unset it to push to the Hub")
    from huggingface_hub import HfApi

    api = HfApi(token=token)
    try:
        api.create_repo(repo_id, private=private, exist_ok=True)
        commit = api.upload_folder(
            folder_path=str(folder),
            repo_id=repo_id,
            commit_message="sql-rl-pipeline: publish models/final",
        )
    except Exception as exc:  # network, auth and hub errors all end here with their reason
        raise PublishError(f"pushing to {repo_id} failed: {type(exc).__name__}: {exc}") from None
    return getattr(commit, "commit_url", str(commit))
