"""The prompt settings a model was trained with, saved in its folder (sqlrl_prompt.json).

The sft stage writes them into models/sft and merge copies them into models/final, so the
server builds prompts the way the served model was trained, whatever params.yaml the
workspace holds now (another profile checked out, say).

They include the model's answer format (grpo.rollout: a name of sqlrl.formats' registry,
and the fields that format saves: the agent's execute_sql bounds), so evaluation, TextToSQL
and the server ask a model the way it was trained (docs/rollouts.md). A folder without them
(written before formats existed, or models/base, which has no file at all) answers in the
`sql` format.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from sqlrl.errors import PipelineError
from sqlrl.formats import FORMATS, get_format
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
    # the answer format (grpo.rollout) and the agent's tool bounds (grpo.agent.*, the tool's
    # time limit grpo.reward_timeout_s), as the model was trained with them
    "rollout": str,
    "max_turns": int,
    "max_rows": int,
    "max_chars": int,
    "tool_timeout_s": float,
}
FIELDS = tuple(_TYPES)
FORMAT_FIELDS = ("rollout", "max_turns", "max_rows", "max_chars", "tool_timeout_s")
AGENT_FIELDS = FORMAT_FIELDS[1:]
# settings added later, with the value a file written before them means; written only when
# they differ from it, so a default run's model folders stay byte for byte what they were
# (the agent bounds' defaults are conf/config.yaml's)
OPTIONAL = {
    "column_descriptions": False,
    "rollout": "sql",
    "max_turns": 5,
    "max_rows": 10,
    "max_chars": 1000,
    "tool_timeout_s": 5.0,
}
REQUIRED = tuple(name for name in FIELDS if name not in OPTIONAL)
PREPARE_FIELDS = tuple(n for n in FIELDS if n != "schema_repair" and n not in FORMAT_FIELDS)


class PromptSettingsError(PipelineError, FileNotFoundError):
    """A model folder has no (usable) prompt settings; the message says what to do."""


def format_settings(grpo=None) -> dict:
    """The answer-format fields of `grpo` (GrpoParams), as its format saves them (the
    rollout; the agent adds its tool's bounds); {} without grpo."""
    if grpo is None:
        return {}
    return get_format(grpo.rollout).prompt_settings(grpo)


def write_prompt_settings(model_dir: str | Path, prepare, schema_repair: bool, grpo=None) -> Path:
    """Save the prompt-building part of `prepare` (PrepareParams), eval.schema_repair and the
    answer format of `grpo` (GrpoParams: the format SFT's rows were written in)."""
    settings = {name: getattr(prepare, name) for name in PREPARE_FIELDS}
    settings["schema_repair"] = bool(schema_repair)
    settings.update(format_settings(grpo))
    settings = {k: v for k, v in settings.items() if k not in OPTIONAL or v != OPTIONAL[k]}
    return write_json(Path(model_dir) / PROMPT_SETTINGS_FILE, settings)


def read_prompt_settings(model_dir: str | Path) -> dict:
    """The settings saved with the model, every field present and of its type."""
    path = Path(model_dir) / PROMPT_SETTINGS_FILE
    settings = _load(path)
    missing = [name for name in REQUIRED if name not in settings]
    if missing:
        raise PromptSettingsError(f"{path}: missing {', '.join(missing)}")
    return _checked(path, settings, FIELDS)


def read_answer_format(model_dir: str | Path) -> AnswerFormat:
    """The model's answer format, checked: what evaluation needs of the folder. No settings
    file (models/base, a hub model) or no format fields in it: `sql`."""
    path = Path(model_dir) / PROMPT_SETTINGS_FILE
    if not path.is_file():
        return AnswerFormat()
    return AnswerFormat(**_checked(path, _load(path), FORMAT_FIELDS))


def _load(path: Path) -> dict:
    """The file's JSON object, the OPTIONAL fields it lacks at their defaults."""
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
    return {**OPTIONAL, **settings}


def _checked(path: Path, settings: dict, names) -> dict:
    """`names` of settings, each of its type (an int is a float too) and in its range: a
    hand-edited file fails here, not on every request or mid-evaluation."""
    for name in names:
        kind, value = _TYPES[name], settings[name]
        if not (type(value) is kind or (kind is float and type(value) is int)):
            raise PromptSettingsError(
                f"{path}: {name} must be of type {kind.__name__}, got {value!r}"
            )
    if "rollout" in names and settings["rollout"] not in FORMATS:
        raise PromptSettingsError(
            f"{path}: unknown answer format rollout={settings['rollout']!r} (one of "
            f"{', '.join(FORMATS)}): this code cannot ask the model the way it was trained"
        )
    low = [n for n in AGENT_FIELDS if n in names and not settings[n] > 0]
    if low:
        raise PromptSettingsError(f"{path}: {', '.join(low)} must be > 0")
    return {name: _TYPES[name](settings[name]) for name in names}


@dataclass(frozen=True)
class AnswerFormat:
    """How a model answers (grpo.rollout, docs/rollouts.md) and, for `agent`, the bounds of
    its execute_sql tool: what inference must repeat of training (OPTIONAL's defaults)."""

    rollout: str = "sql"
    max_turns: int = 5  # tool-call rounds before the answer (TRL's max_tool_calling_iterations)
    max_rows: int = 10  # rows an observation shows
    max_chars: int = 1000  # characters of an observation
    tool_timeout_s: float = 5.0  # one probe's time limit (grpo.reward_timeout_s)

    def __post_init__(self):
        if self.rollout not in FORMATS:
            raise ValueError(f"rollout must be one of {tuple(FORMATS)}, got {self.rollout!r}")


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
    rollout: str = "sql"  # the answer format, and the agent's bounds: AnswerFormat's
    max_turns: int = 5
    max_rows: int = 10
    max_chars: int = 1000
    tool_timeout_s: float = 5.0

    def __post_init__(self):
        if self.schema_format not in SCHEMA_FORMATS:
            raise ValueError(
                f"schema format must be one of {SCHEMA_FORMATS}, got {self.schema_format!r}"
            )
        self.answer_format  # noqa: B018  (checks the rollout)

    def record(self) -> dict:
        """The settings as the server's /health shows them: the format fields only where
        they mean something, as the format records them (none for `sql`, so a sql model's
        record is what it was; the tool's bounds for `agent` only)."""
        shown = {name: getattr(self, name) for name in FIELDS}
        recorded = get_format(self.rollout).recorded
        return {k: v for k, v in shown.items() if k not in FORMAT_FIELDS or k in recorded}

    @property
    def answer_format(self) -> AnswerFormat:
        """How the model answers (its format and the agent's tool bounds)."""
        return AnswerFormat(**{name: getattr(self, name) for name in FORMAT_FIELDS})

    @classmethod
    def from_prepare(cls, prepare, schema_repair: bool = False, grpo=None) -> PromptSettings:
        """The prompt fields of a `prepare` params section (PrepareParams) and the answer
        format of `grpo` (GrpoParams; none: sql)."""
        fields = {name: getattr(prepare, name) for name in PREPARE_FIELDS}
        return cls(**fields, schema_repair=schema_repair, **format_settings(grpo))

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
