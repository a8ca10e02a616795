"""HTTP service for a trained text-to-SQL model.

    python -m sqlrl.serve --model models/final --host 127.0.0.1 --port 8000
    SQLRL_MODEL=models/final uvicorn sqlrl.serve:app --host 127.0.0.1 --port 8000

`POST /generate` {"question": ..., and one of "schema_str" | "db_id" | "ddl"} -> {"sql": ...};
optional "execute" (db_id only: rows from the read-only executor), "max_new_tokens",
"temperature", "num_samples" (execution-based voting when executing), "seed", "max_rows",
"constrained" (decode under the schema's grammar, docs/grammar.md; default --constrained).
`POST /v1/chat/completions`: the OpenAI chat API over the same answer path (routes/openai.py).
`GET /`: the playground page, with `POST /execute` (run SQL read-only) and `POST /feedback`
(judgements into --feedback-db, exported by `python -m sqlrl.feedback export`;
routes/playground.py). `GET /health`, `GET /v1/models`, `GET /databases`,
`GET /databases/{db_id}` (routes/native.py). The layers: service.py's docstring.

Prompts are built by sqlrl.data.prompts with the prompt settings saved in the model folder
(sqlrl_prompt.json, written by the sft stage), never the workspace's params.yaml; flags override
them one by one.
Backends: vLLM when installed (AsyncLLMEngine, else LLM), transformers otherwise, with an
asyncio micro-batcher that batches concurrent requests.

Settings: `create_app(ServeConfig(...))`, CLI flags (`python -m sqlrl.serve --help`), or for
the module-level `app` (built on first access; the model loads at startup, never at import)
SQLRL_* environment variables named after the ServeConfig fields (SQLRL_MODEL,
SQLRL_SPIDER_DIR, SQLRL_BACKEND, SQLRL_MAX_BATCH_SIZE, SQLRL_REQUEST_TIMEOUT_S, ...).
"""

from __future__ import annotations

from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.request_input import schema_from_ddl
from sqlrl.serve.application import create_app
from sqlrl.serve.cli import config_from_env, main
from sqlrl.serve.config import ServeConfig
from sqlrl.serve.service import GenerateRequest

__all__ = [
    "GenerateRequest",
    "PromptSettings",
    "ServeConfig",
    "config_from_env",
    "create_app",
    "main",
    "schema_from_ddl",
]

_app = None


def __getattr__(name: str):
    """`sqlrl.serve.app` for uvicorn: built from SQLRL_* variables on first access."""
    global _app
    if name == "app":
        if _app is None:
            _app = create_app(config_from_env())
        return _app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
