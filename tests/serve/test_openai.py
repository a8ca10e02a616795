"""The OpenAI-compatible API (POST /v1/chat/completions, GET /v1/models), called by the real
`openai` package against a live uvicorn server on loopback, with the tiny model trained in
tests/serve/conftest.py: what any OpenAI client (LangChain, WrenAI, Vanna) would see."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from sqlrl.serve import create_app
from tests.serve_helpers import (
    CONCERT_DDL,
    COUNT_SQL,
    NAME_SQL,
    PAIRS,
    SETTINGS,
    serve_config,
    serving,
)

KEY = "test-key"
DB = {"db_id": "concert_singer"}


def ask(question: str) -> list[dict]:
    return [{"role": "user", "content": question}]


@pytest.fixture(scope="module")
def base(trained):
    """A live server with an API key, as `python -m sqlrl.serve` runs it."""
    app = create_app(serve_config(trained, api_key=KEY, batch_wait_ms=5), prompt_settings=SETTINGS)
    with serving(app) as url:
        yield url


@pytest.fixture(scope="module")
def client(base):
    return openai.OpenAI(base_url=base + "/v1", api_key=KEY, max_retries=0, timeout=60)


def test_the_openai_client_gets_the_trained_sql(client, trained):
    for question, sql in PAIRS[:4]:
        r = client.chat.completions.create(
            model=trained.name, messages=ask(question), extra_body=DB
        )
        assert r.choices[0].message.content == sql
        assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason == "stop"
    assert r.object == "chat.completion" and r.model == trained.name
    assert r.usage.prompt_tokens > 50 and r.usage.completion_tokens >= 4
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_a_schema_given_as_ddl_in_the_system_message(client, trained):
    """A client that knows nothing of db_id sends the schema as it would to any chat model:
    prose, a code fence, CREATE TABLE statements."""
    system = f"You write SQLite queries for this schema.\n```sql\n{CONCERT_DDL}\n```\nAnswer with SQL only."
    r = client.chat.completions.create(
        model="anything",
        messages=[{"role": "system", "content": system}, *ask(PAIRS[3][0])],
    )
    assert r.choices[0].message.content == NAME_SQL
    # content as a list of text parts, and an earlier turn the prompt leaves out
    parts = [{"type": "text", "text": PAIRS[0][0]}]
    r = client.chat.completions.create(
        model="anything",
        messages=[
            {"role": "system", "content": CONCERT_DDL},
            *ask("List the stadiums."),
            {"role": "assistant", "content": NAME_SQL},
            {"role": "user", "content": parts},
        ],
    )
    assert r.choices[0].message.content == COUNT_SQL


def test_n_samples_are_voted_and_choice_0_is_the_vote(client, trained):
    r = client.chat.completions.create(
        model=trained.name,
        messages=ask(PAIRS[0][0]),
        n=3,
        temperature=0.3,
        seed=3,
        max_tokens=24,
        extra_body={**DB, "execute": True},
    )
    extension = r.model_dump()["sqlrl"]
    assert len(r.choices) == 3 and [c.index for c in r.choices] == [0, 1, 2]
    assert extension["vote"] == "execution" and extension["num_samples"] == 3
    assert sorted(c.message.content for c in r.choices) == sorted(extension["candidates"])
    assert extension["rows"] == [[6]]  # the voted SQL, run: 6 singers
    assert r.choices[0].message.content.lower().startswith("select count(*)")


def test_streaming_delivers_the_sql_in_openai_chunks(client, trained):
    stream = client.chat.completions.create(
        model=trained.name,
        messages=ask(PAIRS[0][0]),
        stream=True,
        stream_options={"include_usage": True},
        extra_body=DB,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == COUNT_SQL
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[-1].choices == [] and chunks[-1].usage.prompt_tokens > 50
    assert len({c.id for c in chunks}) == 1


def test_models_lists_the_served_model(client, trained):
    assert [m.id for m in client.models.list()] == [trained.name]


def test_refusals_are_openai_errors_saying_what_is_wrong(client, base, trained):
    cases = [
        (dict(messages=ask(PAIRS[0][0])), openai.UnprocessableEntityError, "db_id"),
        (
            dict(messages=ask(PAIRS[0][0]), n=99, extra_body=DB),
            openai.UnprocessableEntityError,
            "n",
        ),
        (
            dict(messages=ask(PAIRS[0][0]), temperature=5, extra_body=DB),
            openai.UnprocessableEntityError,
            "temperature",
        ),
        (
            dict(messages=ask(PAIRS[0][0]), max_tokens=100_000, extra_body=DB),
            openai.UnprocessableEntityError,
            "max_tokens",
        ),
        (
            dict(messages=ask(PAIRS[0][0]), extra_body={"db_id": "nope"}),
            openai.NotFoundError,
            "db_id",
        ),
        (
            dict(messages=ask(PAIRS[0][0]), top_p=0.5, extra_body=DB),
            openai.UnprocessableEntityError,
            "top_p",
        ),
        (
            dict(messages=ask(PAIRS[0][0]), stop=[";"], extra_body=DB),
            openai.UnprocessableEntityError,
            "stop",
        ),
    ]
    for kwargs, error, param in cases:
        with pytest.raises(error) as refused:
            client.chat.completions.create(model=trained.name, **kwargs)
        body = refused.value.response.json()
        assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}
        assert body["error"]["param"] == param, body
        assert body["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.UnprocessableEntityError, match="n must be between 1 and 16, got 99"):
        client.chat.completions.create(model="m", messages=ask("Q?"), n=99, extra_body=DB)
    wrong_key = openai.OpenAI(base_url=base + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong_key.chat.completions.create(model="m", messages=ask("Q?"), extra_body=DB)
    assert refused.value.response.json()["error"]["type"] == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        wrong_key.models.list()


DIGITS = "1" * 5000
RAW = [  # bodies no OpenAI client would send: a 4xx in OpenAI's shape, never a 500
    (b"", 400, "empty request body"),
    (b"[1, 2]", 422, "must be a JSON object"),
    (b'{"model": "m", "messages": ', 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid UTF-8"),
    (json.dumps({"model": "m", "messages": []}).encode(), 422, "messages"),
    (
        json.dumps(
            {"model": "m", "messages": ask("Q?"), "db_id": "concert_singer", "x": 1}
        ).encode(),
        422,
        "unknown field",
    ),
    (
        json.dumps({"messages": ask("Q?"), "db_id": "concert_singer"}).encode(),
        422,
        "model: Field required",
    ),
    (
        json.dumps(
            {"model": "m", "messages": [{"role": "user"}], "db_id": "concert_singer"}
        ).encode(),
        422,
        "question is empty",
    ),
    (
        json.dumps({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}).encode(),
        422,
        "role",
    ),
    (
        json.dumps(
            {
                "model": "m",
                "messages": [{"role": "user", "content": [{"type": "image_url"}]}],
                "db_id": "concert_singer",
            }
        ).encode(),
        422,
        "only text is read",
    ),
    (
        json.dumps(
            {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, *ask("Q?")]}
        ).encode(),
        422,
        "CREATE TABLE",
    ),
    (
        json.dumps(
            {
                "model": "m",
                "messages": [
                    {
                        "role": "system",
                        "content": "CREATE TABLE t (a INT DEFAULT "
                        + "(" * 300
                        + "1"
                        + ")" * 300
                        + ");",
                    },
                    *ask("Q?"),
                ],
            }
        ).encode(),
        422,
        "ddl: nested too deeply",
    ),
    (
        json.dumps(
            {
                "model": "m",
                "messages": [{"role": "system", "content": CONCERT_DDL * 50}, *ask("Q?")],
            }
        ).encode(),
        413,
        "ddl is",
    ),
    (b'{"model": "m", "messages": [], "seed": %s}' % DIGITS.encode(), 400, "more than 4300 digits"),
    (
        json.dumps({"model": "m", "messages": ask("x" * 3000), "db_id": "concert_singer"}).encode(),
        413,
        "question is 3000",
    ),
    (
        json.dumps(
            {"model": "m", "messages": ask("Q?"), "db_id": "concert_singer", "temperature": 1e-300}
        ).encode(),
        422,
        "temperature must be 0",
    ),
    (
        json.dumps(
            {
                "model": "m",
                "messages": ask("Q?"),
                "db_id": "concert_singer",
                "max_tokens": 4,
                "max_completion_tokens": 5,
            }
        ).encode(),
        422,
        "differ",
    ),
    (
        json.dumps({"model": "m", "messages": ask("Q?"), "db_id": "../etc"}).encode(),
        422,
        "not a database name",
    ),
    (b'{"model": "m", "messages": "' + b"x" * 300_000 + b'"}', 413, "over the server's limit"),
]


def test_malformed_chat_requests_get_a_4xx_never_a_500(base):
    headers = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        for body, status, fragment in RAW:
            r = http.post("/v1/chat/completions", content=body)
            assert r.status_code == status, (body[:100], r.text[:300])
            error = r.json()["error"]
            assert fragment in error["message"], (body[:100], error)
        # an unknown route and a wrong method under /v1/ answer in OpenAI's shape too
        r = http.get("/v1/nothing")
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert http.get("/v1/chat/completions").json()["error"]["code"] == "method_not_allowed"
        r = http.post(
            "/v1/chat/completions", json={"model": "m", "messages": ask(PAIRS[0][0]), **DB}
        )
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == COUNT_SQL


def test_32_concurrent_openai_clients_are_all_answered(client, trained):
    def one(i: int) -> str:
        question, _ = PAIRS[i % len(PAIRS)]
        r = client.chat.completions.create(
            model=trained.name, messages=ask(question), extra_body=DB
        )
        return r.choices[0].message.content

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(one, range(32)))
    assert answers == [PAIRS[i % len(PAIRS)][1] for i in range(32)]


def test_sampling_without_a_seed_varies_and_with_a_seed_repeats(client, trained):
    """As OpenAI's API: a regenerate at temperature 1 draws afresh (the seed it drew is in the
    answer, to reproduce it); a request that gives a seed gets the same answer again."""
    question = "Which stadiums hosted concerts by singers older than forty?"

    def sample(**kw):
        r = client.chat.completions.create(
            model=trained.name, messages=ask(question), temperature=1.0, extra_body=DB, **kw
        )
        return r.choices[0].message.content, r.model_extra["sqlrl"]["seed"]

    drawn = [sample() for _ in range(3)]
    seeds = [seed for _, seed in drawn]
    assert len(set(seeds)) == 3 and all(0 <= s < 2**32 for s in seeds)
    assert len({sql for sql, _ in drawn}) > 1, drawn
    again = sample(seed=seeds[0])
    assert again == drawn[0]  # the reported seed reproduces the answer
    assert sample(seed=5) == sample(seed=5)
