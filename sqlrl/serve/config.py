"""The server's configuration: `ServeConfig` (every field a flag and an SQLRL_* variable,
sqlrl.serve.cli) and the served model's prompt settings with the overrides it gives."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, fields

from sqlrl.data.prompt_settings import PromptSettings, PromptSettingsError
from sqlrl.serve.backends import BackendOptions

log = logging.getLogger("sqlrl.serve")


@dataclass
class ServeConfig:
    """Everything the server is configured with (CLI flags / SQLRL_* environment variables)."""

    model: str = "models/final"
    spider_dir: str = "data/raw/spider"  # named databases (relative: to the working directory)
    # live databases (sqlrl/live/databases.py): NAME=URL entries (--database, repeatable; the
    # variable SQLRL_DATABASE holds them whitespace-separated), and a file of them
    database: tuple[str, ...] = ()
    database_file: str | None = None
    max_live_schema_chars: int = 12_000  # a live database's schema text in a prompt, at most
    backend: str = "auto"  # auto | transformers | vllm
    vllm_engine: str = "auto"  # auto | async | llm
    # prompt settings: the model folder's sqlrl_prompt.json; each of these overrides one
    schema_format: str | None = None  # prepare.schema_format
    sample_rows: int | None = None  # prepare.sample_rows
    system_prompt: str | None = None  # prepare.system_prompt
    mark_schema_mentions: bool | None = None  # prepare.mark_schema_mentions
    schema_repair: bool | None = None  # eval.schema_repair
    # schema-constrained decoding (docs/grammar.md) of every request that does not say
    constrained: bool = False
    sample_rows_token_budget: int | None = None  # prepare.max_prompt_tokens
    dtype: str | None = None
    torch_threads: int = 0  # CPU threads for torch (0: the usable cores)
    # batching and deadlines
    max_batch_size: int = 16
    batch_wait_ms: float = 10.0
    max_queue: int = 256
    request_timeout_s: float = 120.0
    # input limits
    max_body_bytes: int = 256 * 1024
    max_question_chars: int = 2000
    max_schema_chars: int = 100_000
    max_ddl_chars: int = 32_000  # DDL is parsed (sqlglot): its cost grows with length
    max_header_bytes: int = 16 * 1024  # request line and headers (431 beyond)
    body_timeout_s: float = 10.0  # the whole body must arrive within it (408 beyond)
    api_key: str | None = None  # when set: Authorization: Bearer <key> (401 without)
    # browsers (sqlrl.serve.trust): host names besides the loopback ones ("*": any), and web
    # origins besides the server's own that may POST; both comma-separated
    allowed_hosts: str | None = None
    allowed_origins: str | None = None
    max_prompt_tokens: int = 0  # 0: the model's context minus max_new_tokens
    # generation settings: defaults and bounds
    max_new_tokens: int = 128  # default per request
    max_new_tokens_limit: int = 512
    max_num_samples: int = 16
    max_temperature: float = 2.0
    sample_temperature: float = 0.8  # used when num_samples > 1 and none is given
    seed: int | None = None  # None: a fresh seed per sampled request (reported in its answer)
    # execution
    exec_timeout_s: float = 5.0
    max_rows: int = 100  # rows returned at most (a request may ask fewer)
    # feedback (POST /feedback, the playground): a SQLite file; None: feedback is off
    feedback_db: str | None = None
    warmup: bool = True  # one short generation at startup (first call is slow)

    def backend_options(self) -> BackendOptions:
        return BackendOptions(
            backend=self.backend,
            vllm_engine=self.vllm_engine,
            max_batch_size=self.max_batch_size,
            batch_wait_s=self.batch_wait_ms / 1000.0,
            max_queue=self.max_queue,
            default_max_new_tokens=self.max_new_tokens,
            seed=self.seed or 0,
            dtype=self.dtype,
            torch_threads=self.torch_threads,
        )

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def prompt_overrides(self) -> dict:
        """{prompt setting: override or None}, keyed as in sqlrl_prompt.json."""
        return {name: getattr(self, field) for name, field in PROMPT_OVERRIDES.items()}


# prompt setting (sqlrl_prompt.json) -> the ServeConfig field (and flag) that overrides it;
# prepare.max_prompt_tokens has another name here: max_prompt_tokens is the request limit
PROMPT_OVERRIDES = {
    "schema_format": "schema_format",
    "sample_rows": "sample_rows",
    "system_prompt": "system_prompt",
    "mark_schema_mentions": "mark_schema_mentions",
    "schema_repair": "schema_repair",
    "max_prompt_tokens": "sample_rows_token_budget",
}


def prompt_settings_for(config: ServeConfig) -> PromptSettings:
    """The served model's prompt settings (PromptSettings.for_model), with the overrides of
    `config`; a model folder without them is an error that names the flags to give."""
    overrides = config.prompt_overrides()
    try:
        return PromptSettings.for_model(config.model, **overrides)
    except PromptSettingsError as exc:
        flags = ", ".join(
            "--" + PROMPT_OVERRIDES[name].replace("_", "-")
            for name, value in overrides.items()
            if value is None
        )
        raise PromptSettingsError(
            f"{exc}. To serve this model anyway, give the settings it was trained with: {flags}"
        ) from None


def with_overrides(config: ServeConfig, overrides: dict) -> ServeConfig:
    """`config` with some fields replaced; an unknown name is a TypeError, not ignored."""
    if not overrides:
        return config
    unknown = set(overrides) - set(ServeConfig.field_names())
    if unknown:
        raise TypeError(f"unknown ServeConfig field(s): {', '.join(sorted(unknown))}")
    return ServeConfig(**{**asdict(config), **overrides})
