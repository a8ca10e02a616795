"""HTTP plumbing every route shares (sqlrl/serve/http.py, http_errors.py): request bodies read
within limits and parsed strictly, content types, the error shapes, the 500 guard, slow bodies
and huge headers, requests whose client has gone, the API key; and a real uvicorn server under
32 concurrent requests."""

from __future__ import annotations

import asyncio
import json
import socket
import time

from fastapi.testclient import TestClient  # a hard dependency: never skip these tests

from sqlrl.serve import ServeConfig, create_app
from tests.serve_helpers import (
    CONCERT_DDL,
    COUNT_SQL,
    LOCAL_URL,
    PAIRS,
    SETTINGS,
    Q,
    ScriptedGenerator,
    scripted_app,
    serve_config,
    serving,
)

BAD = [
    ({"db_id": "concert_singer"}, 422, "question: Field required"),
    ({"question": "  ", "db_id": "concert_singer"}, 422, "question is empty"),
    ({"question": Q}, 422, "exactly one of schema_str, db_id or ddl"),
    (
        {"question": Q, "db_id": "concert_singer", "ddl": "CREATE TABLE t (a)"},
        422,
        "got db_id, ddl",
    ),
    ({"question": Q, "db_id": "no_such_db"}, 404, "unknown db_id 'no_such_db'"),
    ({"question": Q, "db_id": "../../etc/passwd"}, 422, "not a database name"),
    ({"question": Q, "db_id": "wta_1", "execute": True}, 404, "'wta_1' is in tables.json but"),
    ({"question": Q, "schema_str": "t | a", "execute": True}, 422, "execute needs a db_id"),
    ({"question": 7, "db_id": "concert_singer"}, 422, "question: Input should be a valid string"),
    ({"question": Q, "db_id": "concert_singer", "execute": "yes"}, 422, "execute: Input should"),
    ({"question": Q, "db_id": "concert_singer", "num_samples": "2"}, 422, "num_samples: Input"),
    ({"question": Q, "db_id": "concert_singer", "prompt": "x"}, 422, "prompt: unknown field"),
    ({"question": "x" * 5000, "db_id": "concert_singer"}, 413, "question is 5000 characters"),
    ({"question": Q, "schema_str": "t | a" * 30000}, 413, "schema_str is 150000 characters"),
    (
        {"question": Q, "db_id": "concert_singer", "max_new_tokens": 100000},
        422,
        "max_new_tokens must be between 1 and 512",
    ),
    ({"question": Q, "db_id": "concert_singer", "temperature": 9.0}, 422, "temperature must"),
    (
        {"question": Q, "db_id": "concert_singer", "num_samples": 99, "temperature": 1.0},
        422,
        "num_samples must be between 1 and 16",
    ),
    (
        {"question": Q, "db_id": "concert_singer", "num_samples": 2, "temperature": 0},
        422,
        "temperature must be > 0 when num_samples > 1",
    ),
    ({"question": Q, "ddl": "CREATE TABLE ("}, 422, "ddl: cannot parse"),
    ({"question": Q, "ddl": "SELECT 1"}, 422, "no CREATE TABLE statement"),
    ({"question": "\ud800 how many?", "db_id": "concert_singer"}, 400, "not valid Unicode"),
    ([1, 2], 422, "must be a JSON object, got list"),
]


RAW_BAD = [
    (b'{"question": "caf\xe9", "db_id": "concert_singer"}', 400, "not valid UTF-8"),
    (b'{"question": ', 400, "not valid JSON"),
    (b"", 400, "empty request body"),
    (b'{"question": "' + b"x" * 300_000 + b'"}', 413, "over the server's limit"),
]


def test_bad_input_gets_a_4xx_saying_what_is_wrong_and_the_server_keeps_serving(client):
    for body, status, fragment in BAD:
        data = json.dumps(body, ensure_ascii=True).encode()
        r = client.post("/generate", content=data, headers={"content-type": "application/json"})
        assert r.status_code == status, (body, r.text)
        assert fragment in r.json()["detail"], (body, r.json())
    for data, status, fragment in RAW_BAD:
        r = client.post("/generate", content=data, headers={"content-type": "application/json"})
        assert r.status_code == status, (data[:40], r.text)
        assert fragment in r.json()["detail"]
    good = json.dumps({"question": Q, "db_id": "concert_singer"}).encode()
    for content_type in (None, "text/plain", "application/x-www-form-urlencoded"):
        headers = {"content-type": content_type} if content_type else {}
        r = client.post("/generate", content=good, headers=headers)  # what a form can send
        assert r.status_code == 415, (content_type, r.text)
        assert "Content-Type: application/json" in r.json()["detail"]
    r = client.post("/generate", content=good, headers={"content-type": "Application/JSON; x=1"})
    assert r.status_code == 200
    r = client.post("/generate", json={"question": Q, "db_id": "concert_singer"})
    assert r.status_code == 200 and r.json()["sql"] == COUNT_SQL


DEEP_DDL = "CREATE TABLE t (a INT DEFAULT " + "(" * 300 + "1" + ")" * 300 + ");"


DIGITS = "1" * 5000  # over Python's 4300-digit limit for int(): json.loads raises ValueError


MALFORMED = [  # raw JSON bodies the server cannot understand: a 4xx saying why, never a 500
    (json.dumps({"question": Q, "ddl": DEEP_DDL}), 422, "ddl: nested too deeply"),
    (
        '{"question": "%s", "db_id": "concert_singer", "seed": %s}' % (Q, DIGITS),
        400,
        "a number of more than 4300 digits",
    ),
    ('{"question": %s, "db_id": "concert_singer"}' % DIGITS, 400, "more than 4300 digits"),
    ('{"question": "%s", "db_id": "concert_singer", "x": [[%s]]}' % (Q, DIGITS), 400, "digits"),
    (
        json.dumps({"question": Q, "db_id": "concert_singer", "temperature": 1e-300}),
        422,
        "temperature must be 0 (greedy) or between 0.01 and 2, got 1e-300",
    ),
    (
        json.dumps({"question": Q, "ddl": CONCERT_DDL, "num_samples": 2, "temperature": 1e-3}),
        422,
        "temperature must be 0 (greedy) or between 0.01",
    ),
    (
        '{"question": "%s", "db_id": "concert_singer", "temperature": NaN}' % Q,
        422,
        "temperature must",
    ),
    (
        '{"question": "%s", "db_id": "concert_singer", "temperature": -Infinity}' % Q,
        422,
        "temperature must",
    ),
    (
        '{"question": "%s", "db_id": "concert_singer", "max_new_tokens": 1e400}' % Q,
        422,
        "max_new_tokens: Input should be a valid integer",
    ),
    (
        '{"question": "%s", "db_id": "concert_singer", "max_rows": %s}' % (Q, "9" * 4000),
        422,
        "max_rows must be between 0 and 100",
    ),
]


def test_requests_the_server_cannot_understand_get_a_4xx_never_a_500(client):
    """Issue item 5: deep DDL (RecursionError in sqlglot), a 5000-digit number (json.loads'
    ValueError), a temperature so small sampling gets NaN probabilities."""
    for body, status, fragment in MALFORMED:
        r = client.post(
            "/generate", content=body.encode(), headers={"content-type": "application/json"}
        )
        assert r.status_code == status, (body[:80], r.text[:300])
        assert fragment in r.json()["detail"], (body[:80], r.json())
    r = client.post(
        "/generate",
        json={"question": Q, "db_id": "concert_singer", "temperature": 0.01, "max_new_tokens": 4},
    )
    assert r.status_code == 200  # the lowest temperature samples without NaNs


def test_an_unexpected_failure_is_a_logged_500_that_names_nothing_internal(
    trained, tokenizer, monkeypatch, caplog
):
    def broken(*args, **kwargs):
        raise KeyError("/srv/private/spider/tables.json")

    app = scripted_app(trained, tokenizer, ScriptedGenerator())
    with TestClient(app, base_url=LOCAL_URL) as c:
        monkeypatch.setattr(app.state.service.prompts, "messages", broken)
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
    assert r.status_code == 500
    assert r.json() == {"detail": "internal server error (the server log has the details)"}
    assert "/srv/private" in caplog.text and "KeyError" in caplog.text  # the log has it all


def _raw_post(body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (
        f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n"
    ).encode() + data


def _raw_response(sock) -> tuple[int, bytes]:
    """Status and body of the response on `sock`, read until the server closes it."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _wait_until(condition, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_requests_whose_client_has_gone_never_reach_the_model(trained, tokenizer):
    """Issue item 7: five clients queue behind a busy model and leave; only the request whose
    client waited (and a later one) are generated."""
    import httpx

    gen = ScriptedGenerator(delay=60.0)
    app = scripted_app(trained, tokenizer, gen, max_batch_size=1)
    body = {"question": Q, "db_id": "concert_singer"}
    with serving(app) as base:
        host, port = base.removeprefix("http://").split(":")
        backend = app.state.service.backend
        try:
            first = socket.create_connection((host, int(port)), timeout=30)
            first.sendall(_raw_post(body))
            _wait_until(lambda: gen.calls == [1])  # in the model
            leavers = [socket.create_connection((host, int(port))) for _ in range(5)]
            for sock in leavers:
                sock.sendall(_raw_post(body))
            _wait_until(lambda: backend.stats.requests == 6)  # all five queued
            for sock in leavers:
                sock.close()
            _wait_until(lambda: app.state.service.counts["499"] == 5)
        finally:
            gen.release.set()
        status, _ = _raw_response(first)
        first.close()
        assert status == 200
        assert httpx.post(base + "/generate", json=body, timeout=30).status_code == 200
    assert gen.calls == [1, 1]  # the five abandoned requests were dropped before the model
    assert backend.stats.expired == 5


def test_slow_bodies_time_out_with_408_and_huge_headers_get_431(trained, tokenizer):
    """Issue item 7: a body that never finishes arriving is cut off; a 200 kB header gets a
    431 (uvicorn alone answers 400 and resets the connection)."""
    import httpx

    app = scripted_app(trained, tokenizer, ScriptedGenerator(), body_timeout_s=0.5)
    with serving(app) as base:
        host, port = base.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(
                b"POST /generate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\n"
                b'Content-Type: application/json\r\n\r\n{"question": '
            )
            # the other 87 bytes never come; without the body timeout the server would wait
            # for them past this socket's own 10 s timeout
            status, answer = _raw_response(sock)
        assert status == 408
        assert json.loads(answer)["detail"] == "request body not received within 0.5 s"
        r = httpx.get(base + "/health", headers={"x-padding": "a" * 200_000}, timeout=10)
        assert r.status_code == 431, r.text
        assert "over the server's limit of 16384" in r.json()["detail"]
        assert httpx.get(base + "/health", timeout=10).status_code == 200


def test_an_api_key_guards_every_route_but_a_minimal_health(trained, tokenizer, monkeypatch):
    from sqlrl.serve.cli import build_parser, config_from_env

    assert ServeConfig().api_key is None  # off by default
    app = scripted_app(trained, tokenizer, ScriptedGenerator(), api_key="s3cret")
    body = {"question": Q, "db_id": "concert_singer"}
    key = {"Authorization": "Bearer s3cret"}
    with TestClient(app, base_url=LOCAL_URL) as c:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            r = c.post("/generate", json=body, headers=headers)
            assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.get("/databases").status_code == 401 and c.get("/v1/models").status_code == 401
        assert c.get("/health").json() == {"status": "ok"}  # for load balancers
        assert c.post("/generate", json=body, headers=key).json()["sql"] == "SELECT 1"
        assert c.get("/databases", headers=key).status_code == 200
        assert c.get("/health", headers=key).json()["model_loaded"] is True
    monkeypatch.setenv("SQLRL_API_KEY", "from-env")
    assert config_from_env().api_key == "from-env"
    assert "from-env" not in build_parser().format_help()  # --help does not print it


def test_real_uvicorn_server_answers_32_concurrent_requests(trained):
    import httpx

    app = create_app(
        serve_config(trained, max_batch_size=8, batch_wait_ms=5), prompt_settings=SETTINGS
    )
    with serving(app) as base:

        async def burst():
            async with httpx.AsyncClient(base_url=base, timeout=60) as http:
                bodies = [
                    {
                        "question": PAIRS[i % len(PAIRS)][0],
                        "db_id": "concert_singer",
                        "execute": i % 2 == 0,
                    }
                    for i in range(32)
                ]
                return await asyncio.gather(*(http.post("/generate", json=b) for b in bodies))

        responses = asyncio.run(burst())
        assert [r.status_code for r in responses] == [200] * 32
        assert [r.json()["sql"] for r in responses] == [PAIRS[i % len(PAIRS)][1] for i in range(32)]
        assert responses[0].json()["rows"] == [[6]]
        health = httpx.get(base + "/health", timeout=10).json()
        batching = health["batching"]
        assert batching["requests"] == 32 and batching["largest_batch"] > 1  # batched
        assert batching["batches"] < 32
