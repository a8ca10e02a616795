"""The prompt settings a model was trained with, saved in its folder (sqlrl_prompt.json).

The sft stage writes them into models/sft and merge copies them into models/final, so the
server builds prompts the way the served model was trained, whatever params.yaml the
workspace holds now (another profile checked out, say).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sqlrl.errors import PipelineError
from sqlrl.jsonio import write_json
from sqlrl.params import SCHEMA_FORMATS

PROMPT_SETTINGS_FILE = "sqlrl_prompt.json"
_TYPES = {
    "schema_format": str,
    "sample_rows": int,
    "max_prompt_tokens": int,
    "system_prompt": str,
    "mark_schema_mentions": bool,
    "schema_repair": bool,
    "column_descriptions": bool,
}
FIELDS = tuple(_TYPES)
# settings added later, with the value a file written before them means; written only when
# they differ from it, so a default run's model folders stay byte for byte what they were
OPTIONAL = {"column_descriptions": False}
REQUIRED = tuple(name for name in FIELDS if name not in OPTIONAL)


class PromptSettingsError(PipelineError, FileNotFoundError):
    """A model folder has no (usable) prompt settings; the message says what to do."""


def write_prompt_settings(model_dir: str | Path, prepare, schema_repair: bool) -> Path:
    """Save the prompt-building part of `prepare` (PrepareParams) and eval.schema_repair."""
    settings = {name: getattr(prepare, name) for name in FIELDS if name != "schema_repair"}
    settings["schema_repair"] = bool(schema_repair)
    settings = {k: v for k, v in settings.items() if k not in OPTIONAL or v != OPTIONAL[k]}
    return write_json(Path(model_dir) / PROMPT_SETTINGS_FILE, settings)


def read_prompt_settings(model_dir: str | Path) -> dict:
    """The settings saved with the model, every field present and of its type."""
    path = Path(model_dir) / PROMPT_SETTINGS_FILE
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PromptSettingsError(
            f"{path} is missing, so the prompts this model was trained on are unknown: the "
            f"sft stage writes it and merge copies it into models/final (a model trained "
            f"before they did needs `dvc repro` again)"
        ) from None
    except (OSError, ValueError) as exc:
        raise PromptSettingsError(f"{path}: unreadable ({exc})") from None
    if not isinstance(settings, dict):
        raise PromptSettingsError(f"{path}: not a JSON object")
    settings = {**OPTIONAL, **settings}
    missing = [name for name in REQUIRED if name not in settings]
    if missing:
        raise PromptSettingsError(f"{path}: missing {', '.join(missing)}")
    for name, kind in _TYPES.items():  # a hand-edited file fails here, not on every request
        if type(settings[name]) is not kind:
            raise PromptSettingsError(
                f"{path}: {name} must be of type {kind.__name__}, got {settings[name]!r}"
            )
    return {name: settings[name] for name in FIELDS}


@dataclass(frozen=True)
class PromptSettings:
    """The params that shaped the served model's training prompts (its sqlrl_prompt.json):
    the prepare section's prompt fields, and eval.schema_repair."""

    schema_format: str
    sample_rows: int
    system_prompt: str
    mark_schema_mentions: bool = False
    schema_repair: bool = False
    max_prompt_tokens: int = 0  # DDL sample rows shrink until a prompt fits (0: no limit)
    column_descriptions: bool = False  # BIRD's database_description/ in the schema text

    def __post_init__(self):
        if self.schema_format not in SCHEMA_FORMATS:
            raise ValueError(
                f"schema format must be one of {SCHEMA_FORMATS}, got {self.schema_format!r}"
            )

    @classmethod
    def from_prepare(cls, prepare, schema_repair: bool = False) -> PromptSettings:
        """The prompt fields of a `prepare` params section (PrepareParams)."""
        fields = {name: getattr(prepare, name) for name in FIELDS if name != "schema_repair"}
        return cls(**fields, schema_repair=schema_repair)

    @classmethod
    def for_model(cls, model_dir: str | Path, **overrides) -> PromptSettings:
        """The settings saved in `model_dir`, each non-None override on top (per field).

        Never params.yaml: the workspace may hold another profile than the one the model was
        trained with. With every required field overridden the folder needs no settings file
        (a setting added later, OPTIONAL, then takes its default)."""
        values = {k: v for k, v in overrides.items() if v is not None}
        unknown = set(values) - set(FIELDS)
        if unknown:
            raise TypeError(f"unknown prompt setting(s): {', '.join(sorted(unknown))}")
        if not set(REQUIRED) <= set(values):
            values = {**read_prompt_settings(model_dir), **values}
        return cls(**values)
