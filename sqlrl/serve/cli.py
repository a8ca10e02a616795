"""Command line and environment configuration of the server.

Every ServeConfig field is a flag (`--max-batch-size 16`) and an environment variable
(`SQLRL_MAX_BATCH_SIZE=16`); flags win over variables, variables over the defaults. The HTTP
server's own settings (host, port, keep-alive, connection limit) are flags and SQLRL_* variables
too; `uvicorn_config` is the uvicorn configuration `main` runs.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from dataclasses import fields

from sqlrl.params import parse_bool
from sqlrl.serve.config import ServeConfig

ENV_PREFIX = "SQLRL_"
# how large a request head uvicorn (h11) reads: far above --max-header-bytes, so that an
# over-long head gets the app's 431 instead of h11's 400 on a socket closed unread (a reset)
HEAD_READ_LIMIT = 1024 * 1024
SECRETS = {"api_key"}  # never shown as a --help default
_HELP = {
    "model": "model folder (save_pretrained output, e.g. models/final)",
    "spider_dir": "Spider release folder (tables.json, database/); db_id requests use it",
    "database": "a live database, NAME=URL (postgresql://user@host/db or sqlite:///path), "
    "repeatable; requests name it as db_id; read-only and bounded (docs/serving.md); the "
    "password is never shown: prefer --database-file, PGPASSWORD or ~/.pgpass, a flag shows "
    "in the process list",
    "database_file": "a file of live databases, one NAME=URL a line (# comments)",
    "max_live_schema_chars": "a live database's schema text in a prompt at most: past it, "
    "the tables the question names are kept first (the answer lists which)",
    "backend": "auto (vLLM if installed, else transformers) | transformers | vllm",
    "vllm_engine": "auto (AsyncLLMEngine when available) | async | llm",
    "schema_format": "override the model's prepare.schema_format (compact | ddl); the "
    "prompt settings come from MODEL/sqlrl_prompt.json, never params.yaml",
    "sample_rows": "override the model's prepare.sample_rows",
    "system_prompt": "override the model's prepare.system_prompt",
    "mark_schema_mentions": "override the model's prepare.mark_schema_mentions (true | false)",
    "schema_repair": "override the model's eval.schema_repair (true | false)",
    "constrained": "decode each answer under its schema's grammar, so that it names only the "
    "database's tables and columns (db_id and ddl requests; a schema_str request decodes "
    "unconstrained); a request's `constrained` overrides it; the sql answer format only",
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
    "max_ddl_chars": "ddl length limit (413 beyond): DDL is parsed, at a cost that grows "
    "with its length",
    "max_header_bytes": "request line and headers size limit (431 beyond)",
    "body_timeout_s": "the request body must arrive within it (408 beyond)",
    "api_key": "require `Authorization: Bearer KEY` on every route but /health (401 "
    "without); prefer SQLRL_API_KEY, a flag shows in the process list",
    "torch_threads": "CPU threads for torch (0: the cores this process may use)",
    "max_question_chars": "question length limit (413 beyond)",
    "max_schema_chars": "schema_str length limit (413 beyond)",
    "max_new_tokens": "tokens generated per answer when a request does not say",
    "max_new_tokens_limit": "the most tokens a request may ask for (422 beyond)",
    "max_num_samples": "the most samples a request may vote over (num_samples; 422 beyond)",
    "max_temperature": "the highest temperature a request may ask for (422 beyond)",
    "sample_temperature": "temperature of num_samples > 1 when a request gives none",
    "seed": "sampling seed when a request gives none (unset: a fresh seed per request, "
    "reported in the answer, so a regenerate varies as OpenAI clients expect)",
    "allowed_hosts": "host names the server answers to besides 127.0.0.1, localhost and ::1 "
    "(comma-separated; '*' any; '*.example.com' subdomains); unset and --host 0.0.0.0: any",
    "allowed_origins": "web origins besides the server's own whose pages may POST to it "
    "(comma-separated, e.g. https://app.example.com); browsers send Origin, other clients "
    "are not affected",
    "exec_timeout_s": "time limit of one read-only execution of an answer (execute: true)",
    "max_rows": "rows an executed answer returns at most (a request may ask fewer)",
    "feedback_db": "SQLite file that POST /feedback and the playground store judgements in "
    "(created when absent; export them with `python -m sqlrl.feedback export`); unset: "
    "feedback is off",
    "warmup": "one short generation at start-up, so the first request is not the slow one",
}


def _type(field) -> type:
    hint = typing.get_type_hints(ServeConfig)[field.name]
    if typing.get_origin(hint) is tuple:  # --database NAME=URL, repeatable
        return tuple
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _converter(kind: type):
    return parse_bool if kind is bool else kind


def _parse(kind: type, raw: str, name: str):
    if kind is tuple:  # whitespace-separated entries
        return tuple(raw.split())
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


def _default(value):
    """A flag's default: the variable's value (a list, for a repeatable flag to append to)."""
    return list(value) if isinstance(value, tuple) else value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sqlrl.serve",
        description="Serve a text-to-SQL model over HTTP.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        epilog=f"Every flag is also an environment variable: {ENV_PREFIX}<FLAG> in capitals "
        f"with _ for - (shown with each flag); a flag wins over its variable.",
    )
    parser.add_argument(
        "--host",
        default=os.environ.get("SQLRL_HOST", "127.0.0.1"),
        help="the address to listen on (127.0.0.1: this machine only) [SQLRL_HOST]",
    )
    parser.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("SQLRL_PORT", "8000")),
        help="the port to listen on [SQLRL_PORT]",
    )
    parser.add_argument(
        "--log-level", default="info", help="uvicorn's log level: debug, info, warning, error"
    )
    parser.add_argument(
        "--timeout-keep-alive",
        type=int,
        default=int(os.environ.get("SQLRL_TIMEOUT_KEEP_ALIVE", "5")),
        help="seconds an idle keep-alive connection is kept open [SQLRL_TIMEOUT_KEEP_ALIVE]",
    )
    parser.add_argument(
        "--limit-concurrency",
        type=int,
        default=int(os.environ.get("SQLRL_LIMIT_CONCURRENCY", "0")),
        help="connections at most; beyond it uvicorn answers 503 (0: no limit) "
        "[SQLRL_LIMIT_CONCURRENCY]",
    )
    env = config_from_env()
    for f in fields(ServeConfig):
        secret = f.name in SECRETS
        kind = _type(f)
        # a true|false flag alone means true (`--constrained`), as well as `--constrained true`
        bare = {"nargs": "?", "const": True} if kind is bool else {}
        if kind is tuple:  # repeatable; flags add to the variable's entries
            bare = {"action": "append"}
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            type=str if kind is tuple else _converter(kind),
            default=None if secret else _default(getattr(env, f.name)),
            help=f"{_HELP[f.name]} [{ENV_PREFIX}{f.name.upper()}]",
            **bare,
        )
    return parser


def uvicorn_config(
    app,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    log_level: str = "info",
    timeout_keep_alive: int = 5,
    limit_concurrency: int = 0,
):
    """The uvicorn settings `main` serves with: the h11 parser (whose head limit is set), a
    head read limit above the app's 431, keep-alive timeout and connection limit. Proxy
    headers are trusted from FORWARDED_ALLOW_IPS (uvicorn's default: 127.0.0.1)."""
    import uvicorn

    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=log_level,
        http="h11",
        h11_max_incomplete_event_size=HEAD_READ_LIMIT,
        timeout_keep_alive=timeout_keep_alive,
        limit_concurrency=limit_concurrency or None,
    )


WILDCARD_ADDRESSES = ("0.0.0.0", "::", "")


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost: reachable from this machine only."""
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def for_bind_address(config: ServeConfig, host: str) -> ServeConfig:
    """`config` for serving on `host`. Without an API key only a loopback address (anyone who
    can reach the port could otherwise write feedback, i.e. training data); a specific
    address is added to the allowed host names, and a wildcard one allows any name unless
    --allowed-hosts says which."""
    if not config.api_key and not is_loopback(host):
        raise ValueError(
            f"--host {host} would serve other machines, and without an API key anyone who "
            "reaches the port could use the model and write training data; set SQLRL_API_KEY "
            "(or --api-key) to serve beyond this machine, or keep --host 127.0.0.1"
        )
    if is_loopback(host) or config.allowed_hosts:
        return config
    extra = "*" if host in WILDCARD_ADDRESSES else host
    return dataclasses.replace(config, allowed_hosts=extra)


def main(argv=None) -> int:
    import uvicorn

    from sqlrl.data.prompt_settings import PromptSettingsError
    from sqlrl.errors import PipelineError
    from sqlrl.serve.application import create_app

    args = build_parser().parse_args(argv)
    values = {f.name: getattr(args, f.name) for f in fields(ServeConfig)}
    values["database"] = tuple(values["database"] or ())
    env = config_from_env()
    values.update({name: getattr(env, name) for name in SECRETS if values[name] is None})
    config = ServeConfig(**values)
    try:
        config = for_bind_address(config, args.host)
    except ValueError as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    if not os.path.isdir(config.model):
        print(
            f"serve: model folder {config.model!r} does not exist (train it with `dvc repro`,"
            f" or pass --model)",
            file=sys.stderr,
        )
        return 2
    try:
        app = create_app(config)
    # no or bad prompt settings; --constrained for a model whose format it does not cover
    except (PromptSettingsError, ValueError, PipelineError) as exc:
        print(f"serve: {exc}", file=sys.stderr)
        return 2
    if not config.api_key:
        print(
            f"serve: no API key: listening on {args.host} only (this machine); set "
            "SQLRL_API_KEY to serve others",
            file=sys.stderr,
        )
    uvicorn.Server(
        uvicorn_config(
            app,
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            timeout_keep_alive=args.timeout_keep_alive,
            limit_concurrency=args.limit_concurrency,
        )
    ).run()
    return 0
