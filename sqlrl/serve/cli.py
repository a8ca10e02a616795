"""Command line and environment configuration of the server.

Every ServeConfig field is a flag (`--max-batch-size 16`) and an environment variable
(`SQLRL_MAX_BATCH_SIZE=16`); flags win over variables, variables over the defaults.
"""
from __future__ import annotations

import argparse
import os
import sys
import typing
from dataclasses import fields

from sqlrl.serve.service import ServeConfig

ENV_PREFIX = "SQLRL_"
_HELP = {
    "model": "model folder (save_pretrained output, e.g. models/final)",
    "spider_dir": "Spider release folder (tables.json, database/); db_id requests use it",
    "backend": "auto (vLLM if installed, else transformers) | transformers | vllm",
    "vllm_engine": "auto (AsyncLLMEngine when available) | async | llm",
    "schema_format": "override the model's prepare.schema_format (compact | ddl); the "
                     "prompt settings come from MODEL/sqlrl_prompt.json, never params.yaml",
    "sample_rows": "override the model's prepare.sample_rows",
    "system_prompt": "override the model's prepare.system_prompt",
    "mark_schema_mentions": "override the model's prepare.mark_schema_mentions (true | false)",
    "schema_repair": "override the model's eval.schema_repair (true | false)",
    "sample_rows_token_budget": "override the model's prepare.max_prompt_tokens (DDL sample "
                                "rows shrink until a prompt fits; 0: no limit)",
    "dtype": "model dtype (float32, bfloat16); default: the model's own",
    "max_batch_size": "requests generated together at most",
    "batch_wait_ms": "how long the batcher waits for more requests to join a batch",
    "max_queue": "queued requests at most; beyond it requests get 503",
    "request_timeout_s": "deadline of one generation; beyond it the request gets 504",
    "max_body_bytes": "request body size limit (413 beyond)",
    "max_prompt_tokens": "prompt token limit (413 beyond); 0: the model's context minus "
                         "max_new_tokens",
}


def _type(field) -> type:
    hint = typing.get_type_hints(ServeConfig)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def _converter(kind: type):
    return _bool if kind is bool else kind


def _parse(kind: type, raw: str, name: str):
    try:
        return _converter(kind)(raw)
    except ValueError:
        raise SystemExit(f"serve: {name}={raw!r} is not a valid {kind.__name__}") from None


def config_from_env(environ=None, base: ServeConfig | None = None) -> ServeConfig:
    """ServeConfig from SQLRL_<FIELD> variables (unset ones keep `base`'s values)."""
    environ = os.environ if environ is None else environ
    values = dict(vars(base or ServeConfig()))
    for f in fields(ServeConfig):
        raw = environ.get(ENV_PREFIX + f.name.upper())
        if raw is not None and raw != "":
            values[f.name] = _parse(_type(f), raw, ENV_PREFIX + f.name.upper())
    return ServeConfig(**values)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sqlrl.serve", description="Serve a text-to-SQL model over HTTP.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--host", default=os.environ.get("SQLRL_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("SQLRL_PORT", "8000")))
    parser.add_argument("--log-level", default="info")
    env = config_from_env()
    for f in fields(ServeConfig):
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=_converter(_type(f)),
                            default=getattr(env, f.name),
                            help=_HELP.get(f.name, f.name.replace("_", " ")))
    return parser


def main(argv=None) -> int:
    import uvicorn

    from sqlrl.prompt_settings import PromptSettingsError
    from sqlrl.serve.service import create_app

    args = build_parser().parse_args(argv)
    config = ServeConfig(**{f.name: getattr(args, f.name) for f in fields(ServeConfig)})
    if not os.path.isdir(config.model):
        print(f"serve: model folder {config.model!r} does not exist (train it with `dvc repro`,"
              f" or pass --model)", file=sys.stderr)
        return 2
    try:
        app = create_app(config)
    except (PromptSettingsError, ValueError) as exc:  # no or bad prompt settings
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    return 0
