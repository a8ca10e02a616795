"""`POST /v1/chat/completions`: the OpenAI chat API over the server's one answer path, so that
the tools people ask databases questions with (the `openai` package, LangChain, WrenAI, Vanna)
call the model unchanged.

    client = openai.OpenAI(base_url="http://127.0.0.1:8000/v1", api_key=KEY or "none")
    client.chat.completions.create(model="final", extra_body={"db_id": "concert_singer"},
        messages=[{"role": "user", "content": "How many singers do we have?"}])

- The question is the last user message; earlier turns are not part of the prompt (the model
  was trained on one question per prompt).
- The database: `db_id` (the client's `extra_body`) names one of the server's Spider databases;
  without it, CREATE TABLE statements in the system message are the schema (from the first
  CREATE TABLE to the last `;`, code fences dropped). With `db_id` the system message is not
  read: the prompt is the one the model was trained on, its system prompt included.
- The answer: each choice's message content is the SQL, extracted, schema-repaired and (n > 1)
  voted on exactly as /generate does; choice 0 is the voted answer, the others are the
  remaining samples in order. `sqlrl` in the response carries what /generate adds (the vote,
  every candidate, with `execute` the verdict and rows, with constrained decoding whether the
  answer was constrained and why not).
- Constrained decoding: `constrained` (extra_body) as /generate's, the server's --constrained
  when left out: the answer decoded under its schema's grammar (db_id, or the system message's
  CREATE TABLE statements).
- Settings: `n` is /generate's num_samples, `max_tokens` (or `max_completion_tokens`) its
  max_new_tokens, `temperature` and `seed` the same, with the same bounds and defaults (greedy
  for one sample). Parameters that would change decoding in ways the server does not do
  (top_p, penalties, stop, logprobs) are accepted only at their neutral values.
- Streaming (`stream=True`): server-sent events in OpenAI's chunk format. The SQL can only be
  extracted, repaired and voted on whole completions, so each choice's SQL arrives in one
  content chunk once it is chosen; errors come before the stream starts, as a normal 4xx.
- Errors are OpenAI's `{"error": {"message", "type", "param", "code"}}` with the statuses of
  /generate (sqlrl.serve.http_errors); the API key and every limit are the same.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import Literal

from fastapi import FastAPI, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from sqlrl.serve.http import guarded, json_body_schema, parse_body, unless_disconnected
from sqlrl.serve.http_errors import HTTPError
from sqlrl.serve.service import GenerateRequest, Served, Service, generate_body

EXAMPLE = (
    '{"model": "final", "messages": [{"role": "user", "content": "How many singers?"}], '
    '"db_id": "concert_singer"}'
)
# /generate's names for settings -> the OpenAI names a chat client sent them as
OPENAI_NAMES = {"num_samples": "n", "max_new_tokens": "max_tokens"}
# request fields whose errors are about the messages (the question and the DDL come from them)
FROM_MESSAGES = {"question", "ddl", "schema_str"}
# decoding parameters the server does not implement: accepted at their neutral value only
NEUTRAL = {
    "top_p": (1, 1.0),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "logprobs": (False,),
}
CREATE_TABLE = re.compile(r"\bcreate\s+table\b", re.IGNORECASE)


class ContentPart(BaseModel):
    """One part of a message's content; only text parts can carry a question or a schema."""

    model_config = ConfigDict(extra="ignore", strict=True)

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """A chat message. Other keys of earlier turns (tool calls, names) are ignored: only the
    last user message and the system messages are read."""

    model_config = ConfigDict(extra="ignore", strict=True)

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """POST /v1/chat/completions: OpenAI's fields that text-to-SQL uses, and the extensions
    (`db_id`, `execute`, `max_rows`, `constrained`) a client sends with `extra_body`."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str
    messages: list[ChatMessage] = Field(min_length=1, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int | None = None
    temperature: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    seed: int | None = None
    user: str | None = None  # OpenAI's end-user tag; not used
    top_p: float | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    stop: str | list[str] | None = None
    logprobs: bool | None = None
    # extensions (extra_body)
    db_id: str | None = None
    execute: bool = False
    max_rows: int | None = None
    constrained: bool | None = None  # None: the server's --constrained


# --------------------------------------------------------------------------- request


def message_text(message: ChatMessage) -> str:
    """A message's text: its string content, or its text parts joined; an image or audio part
    is a 422 (a text-to-SQL model reads text only)."""
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    texts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise HTTPError(
                422, f"messages: a {part.type!r} content part; only text is read", param="messages"
            )
        texts.append(part.text)
    return "\n".join(texts)


def question_of(chat: ChatCompletionRequest) -> str:
    """The last user message: the question (earlier turns are not part of the prompt)."""
    for message in reversed(chat.messages):
        if message.role == "user":
            return message_text(message)
    raise HTTPError(422, "messages: no user message (it holds the question)", param="messages")


def ddl_of(chat: ChatCompletionRequest) -> str | None:
    """CREATE TABLE statements in the system (or developer) messages: from the first CREATE
    TABLE to the last `;` after it, code fence lines dropped; None when there are none."""
    text = "\n".join(message_text(m) for m in chat.messages if m.role in ("system", "developer"))
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("```"))
    start = CREATE_TABLE.search(text)
    if start is None:
        return None
    end = text.rfind(";")
    return text[start.start() : end + 1] if end > start.start() else text[start.start() :]


def check_neutral(chat: ChatCompletionRequest) -> None:
    """A 422 for a decoding parameter the server would otherwise silently ignore."""
    for name, neutral in NEUTRAL.items():
        value = getattr(chat, name)
        if value is not None and value not in neutral:
            raise HTTPError(
                422,
                f"{name}={value!r} is not supported (this server decodes greedily or with plain "
                f"temperature sampling); leave it out",
                param=name,
            )
    if chat.stop:
        raise HTTPError(
            422, "stop is not supported: the SQL ends where the model ends it", param="stop"
        )


def max_new_tokens_of(chat: ChatCompletionRequest) -> int | None:
    """max_completion_tokens (OpenAI's current name) or max_tokens (the older one)."""
    a, b = chat.max_tokens, chat.max_completion_tokens
    if a is not None and b is not None and a != b:
        raise HTTPError(
            422,
            f"max_tokens ({a}) and max_completion_tokens ({b}) differ; give one",
            param="max_tokens",
        )
    return a if a is not None else b


def generate_request(chat: ChatCompletionRequest) -> GenerateRequest:
    """The /generate request a chat request asks for: question, database or DDL, settings."""
    check_neutral(chat)
    ddl = None if chat.db_id is not None else ddl_of(chat)
    if chat.db_id is None and ddl is None:
        raise HTTPError(
            422,
            'name the database with "db_id" (the client\'s extra_body={"db_id": ...}; GET '
            "/databases lists them) or give the schema as CREATE TABLE statements in a system "
            "message",
            param="db_id",
        )
    return GenerateRequest(
        question=question_of(chat),
        db_id=chat.db_id,
        ddl=ddl,
        execute=chat.execute,
        max_new_tokens=max_new_tokens_of(chat),
        temperature=chat.temperature,
        num_samples=chat.n,
        seed=chat.seed,
        max_rows=chat.max_rows,
        constrained=chat.constrained,
    )


def in_openai_terms(exc: HTTPError) -> HTTPError:
    """A refusal worded for a chat client: /generate's setting names become the OpenAI names
    it sent, and a question or DDL at fault is in `messages`."""
    message, param = exc.message, exc.param
    for ours, theirs in OPENAI_NAMES.items():
        message = message.replace(ours, theirs)
    param = OPENAI_NAMES.get(param, "messages" if param in FROM_MESSAGES else param)
    return HTTPError(exc.status, message, exc.headers, param)


# --------------------------------------------------------------------------- response


def choice_order(served: Served) -> list[int]:
    """Sample indices in choice order: the voted answer first (clients read choices[0]), then
    the other samples in the order they were drawn."""
    chosen = served.answer.chosen
    return [chosen, *(i for i in range(len(served.texts)) if i != chosen)]


def finish_reason(completion_tokens: int, max_new_tokens: int) -> str:
    """'length' when the completion used every token it was allowed (its SQL may be cut)."""
    return "length" if completion_tokens >= max_new_tokens else "stop"


class ChatAnswer:
    """One answered chat request, rendered whole (`body`) or as server-sent events."""

    def __init__(self, service: Service, req: GenerateRequest, served: Served, tokens: list[int]):
        self.id = "chatcmpl-" + secrets.token_hex(12)
        self.created = int(time.time())
        self.model = service.model_name()
        order = choice_order(served)
        self.sqls = [served.answer.candidates[i] for i in order]
        limit = served.opts["max_new_tokens"]
        self.finish = [finish_reason(tokens[i], limit) for i in order]
        self.usage = {
            "prompt_tokens": served.prompt_tokens,
            "completion_tokens": sum(tokens),
            "total_tokens": served.prompt_tokens + sum(tokens),
        }
        extra = generate_body(req, served)
        for key in ("sql", "completion", "usage"):
            extra.pop(key, None)
        extra["generation_seconds"] = round(served.generation_s, 4)
        self.extension = extra

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def body(self) -> dict:
        """The `chat.completion` object."""
        choices = [
            {
                "index": i,
                "message": {"role": "assistant", "content": sql},
                "finish_reason": self.finish[i],
                "logprobs": None,
            }
            for i, sql in enumerate(self.sqls)
        ]
        return {
            **self._head("chat.completion"),
            "choices": choices,
            "usage": self.usage,
            "sqlrl": self.extension,
        }

    def chunks(self, include_usage: bool) -> list[dict]:
        """`chat.completion.chunk` objects: per choice the role, the SQL, the finish reason;
        the usage last when asked for (stream_options.include_usage)."""
        out = []
        for i, sql in enumerate(self.sqls):
            for delta, finish in (
                ({"role": "assistant", "content": ""}, None),
                ({"content": sql}, None),
                ({}, self.finish[i]),
            ):
                chunk = self._head("chat.completion.chunk")
                chunk["choices"] = [
                    {"index": i, "delta": delta, "finish_reason": finish, "logprobs": None}
                ]
                if include_usage:
                    chunk["usage"] = None
                out.append(chunk)
        out[0]["sqlrl"] = self.extension
        if include_usage:
            out.append({**self._head("chat.completion.chunk"), "choices": [], "usage": self.usage})
        return out


def sse(chunks: list[dict]):
    """Server-sent events as OpenAI streams them: one `data:` line per chunk, then [DONE]."""
    for chunk in chunks:
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"


# --------------------------------------------------------------------------- route


async def answer_chat(service: Service, request: Request):
    """Parse, answer and render one chat request; refusals in OpenAI's terms."""
    try:
        chat = await parse_body(request, service.config, ChatCompletionRequest, EXAMPLE)
        req = generate_request(chat)
        served = await unless_disconnected(request, service.answer(req))
        tokens = await service.off_loop(lambda: [service.count_tokens(t) for t in served.texts])
    except HTTPError as exc:
        raise in_openai_terms(exc) from None
    answer = ChatAnswer(service, req, served, tokens)
    if not chat.stream:
        return answer.body()
    include_usage = chat.stream_options is not None and chat.stream_options.include_usage
    return StreamingResponse(
        sse(answer.chunks(include_usage)),
        media_type="text/event-stream",
        headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
    )


def add_routes(app: FastAPI, service: Service, keyed: list) -> None:
    @app.post(
        "/v1/chat/completions",
        dependencies=keyed,
        openapi_extra=json_body_schema(ChatCompletionRequest),
    )
    async def chat_completions(request: Request):
        """OpenAI's chat completions: the SQL for the last user message (see the module)."""
        return await guarded(
            service, "POST /v1/chat/completions", lambda: answer_chat(service, request)
        )
