"""The prompt settings a model was trained with, saved in its folder (sqlrl_prompt.json).

The sft stage writes them into models/sft and merge copies them into models/final, so the
server builds prompts the way the served model was trained, whatever params.yaml the
workspace holds now (another profile checked out, say).
"""
from __future__ import annotations

import json
from pathlib import Path

PROMPT_SETTINGS_FILE = "sqlrl_prompt.json"
FIELDS = ("schema_format", "sample_rows", "max_prompt_tokens", "system_prompt",
          "mark_schema_mentions", "schema_repair")


class PromptSettingsError(FileNotFoundError):
    """A model folder has no (usable) prompt settings; the message says what to do."""


def write_prompt_settings(model_dir: str | Path, prepare, schema_repair: bool) -> Path:
    """Save the prompt-building part of `prepare` (PrepareParams) and eval.schema_repair."""
    settings = {name: getattr(prepare, name) for name in FIELDS if name != "schema_repair"}
    settings["schema_repair"] = bool(schema_repair)
    path = Path(model_dir) / PROMPT_SETTINGS_FILE
    path.write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return path


def read_prompt_settings(model_dir: str | Path) -> dict:
    """The settings saved with the model, every field present."""
    path = Path(model_dir) / PROMPT_SETTINGS_FILE
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PromptSettingsError(
            f"{path} is missing: the model was not trained by this pipeline's sft stage (or "
            f"before prompt settings were saved); rerun `dvc repro sft`, or give every prompt "
            f"setting on the command line") from None
    except (OSError, ValueError) as exc:
        raise PromptSettingsError(f"{path}: unreadable ({exc})") from None
    missing = [name for name in FIELDS if name not in settings]
    if missing:
        raise PromptSettingsError(f"{path}: missing {', '.join(missing)}")
    return {name: settings[name] for name in FIELDS}
