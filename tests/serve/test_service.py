"""The service behind the routes (sqlrl/serve/service.py): one request's answer without HTTP,
through the answer path evaluation and TextToSQL share (sqlrl.answer): schema repair, voting,
the generation deadline (504) and failure (500), DDL parsed off the event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import threading

from fastapi.testclient import TestClient  # a hard dependency: never skip these tests

from sqlrl.request_input import RequestInput
from sqlrl.serve import PromptSettings
from tests.repo_tools import SPIDER_DIR
from tests.serve_helpers import (
    CONCERT_DDL,
    LOCAL_URL,
    SETTINGS,
    Q,
    ScriptedGenerator,
    scripted_app,
    serving,
)


class _Samples:
    """A Generator double that answers every prompt with the same texts: the first greedily,
    all of them when sampled."""

    def __init__(self, texts):
        self.texts = texts

    def generate(self, prompts):
        return [self.texts[0]] * len(prompts)

    def sample(self, prompts, n, temperature, seed):
        assert n == len(self.texts)
        return [list(self.texts) for _ in prompts]


# the candidates of one question on concert_singer: the first names a table of another
# database (schema repair maps it onto singer), the second returns other rows, the third
# agrees with the repaired first, the fourth fails. Repaired, the vote is 2 for the first;
# unrepaired, the first fails and the second wins (the first of three groups of one).
CANDIDATES = [
    "```sql\nSELECT count(*) FROM performance\n```",
    "SELECT Name FROM singer",
    "SELECT count(*) FROM singer",
    "SELECT nope FROM singer",
]


def test_evaluation_the_server_and_the_python_api_answer_alike(trained, tokenizer):
    """One answer path (sqlrl.answer): given the same generated texts, evaluation (greedy
    and maj@k), TextToSQL and the server choose the same SQL from the same completion with
    the same votes, with schema repair on and off."""
    from sqlrl.data.prompts import render_prompt
    from sqlrl.eval.evaluate import evaluate_split
    from sqlrl.text_to_sql import TextToSQL

    db_path = str(SPIDER_DIR / "database" / "concert_singer" / "concert_singer.sqlite")
    answers = {}
    for repair in (True, False):
        settings = dataclasses.replace(SETTINGS, schema_repair=repair)
        builder = RequestInput(settings, SPIDER_DIR)
        row = {
            "question": Q,
            "gold": "SELECT count(*) FROM singer",
            "db_id": "concert_singer",
            "db_path": db_path,
            "prompt": builder.messages(Q, db_id="concert_singer"),
        }
        _, (evaluated,) = evaluate_split(
            [row],
            _Samples(CANDIDATES),
            lambda messages: render_prompt(tokenizer, messages),
            tables_json=SPIDER_DIR / "tables.json",
            vote_samples=len(CANDIDATES),
            temperature=0.8,
            schema_repair=repair,
            workers=1,
        )
        api = TextToSQL(trained, spider_dir=SPIDER_DIR, **dataclasses.asdict(settings))
        api.generator = _Samples(CANDIDATES)
        greedy = api.answer(Q, db="concert_singer")
        voted = api.answer(
            Q, db="concert_singer", execute=True, num_samples=len(CANDIDATES), temperature=0.8
        )
        app = scripted_app(trained, tokenizer, _Samples(CANDIDATES), prompt_settings=settings)
        with TestClient(app, base_url=LOCAL_URL) as c:
            served_greedy = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
            served = c.post(
                "/generate",
                json={
                    "question": Q,
                    "db_id": "concert_singer",
                    "execute": True,
                    "num_samples": len(CANDIDATES),
                    "temperature": 0.8,
                },
            ).json()
        answers[repair] = (evaluated["maj_pred"], evaluated["votes"])
        assert evaluated["pred"] == greedy.sql == served_greedy.json()["sql"]
        assert evaluated["output"] == greedy.completion == served_greedy.json()["completion"]
        assert (voted.sql, voted.votes) == (served["sql"], served["votes"]) == answers[repair]
        assert voted.completion == served["completion"] == CANDIDATES[voted.chosen]
        assert voted.candidates == served["candidates"]
    assert answers == {
        True: ("SELECT COUNT(*) FROM singer", 2),
        False: ("SELECT Name FROM singer", 1),
    }


def test_schema_repair_maps_unknown_names_where_the_schema_is_known(trained, tokenizer):
    """A model that writes another database's table: repaired for db_id and ddl requests."""
    memorised = ScriptedGenerator(text="SELECT count(*) FROM performance")
    repair = PromptSettings("compact", 0, "You are a text-to-SQL assistant.", schema_repair=True)
    with TestClient(
        scripted_app(trained, tokenizer, memorised, prompt_settings=repair), base_url=LOCAL_URL
    ) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer", "execute": True})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["sql"] == "SELECT COUNT(*) FROM singer" and body["rows"] == [[6]]
        assert body["completion"] == "SELECT count(*) FROM performance"
        r = c.post("/generate", json={"question": Q, "ddl": CONCERT_DDL})
        assert r.json()["sql"] == "SELECT COUNT(*) FROM singer"
        r = c.post("/generate", json={"question": Q, "schema_str": "singer | Name, Age"})
        assert r.json()["sql"] == "SELECT count(*) FROM performance"  # free text: no names
    with TestClient(
        scripted_app(trained, tokenizer, memorised), base_url=LOCAL_URL
    ) as c:  # repair off
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.json()["sql"] == "SELECT count(*) FROM performance"


def test_a_hung_generation_times_out_with_504_and_a_failure_is_a_500(trained, tokenizer):
    slow = ScriptedGenerator(delay=30.0)
    with TestClient(
        scripted_app(trained, tokenizer, slow, request_timeout_s=0.3), base_url=LOCAL_URL
    ) as c:
        # the generation is held for 30 s: a 504 means the request did not wait for it
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 504 and "did not finish within 0.3 s" in r.json()["detail"]
        assert c.get("/health").status_code == 200  # still serving
        slow.release.set()
    broken = ScriptedGenerator(error=RuntimeError("CUDA out of memory"))
    with TestClient(scripted_app(trained, tokenizer, broken), base_url=LOCAL_URL) as c:
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 500
        assert r.json()["detail"] == "generation failed (the server log has the details)"
        assert "CUDA" not in r.text  # logged, not shown
        broken.error = None  # the next batch works again
        r = c.post("/generate", json={"question": Q, "db_id": "concert_singer"})
        assert r.status_code == 200 and r.json()["sql"] == "SELECT 1"


def test_health_answers_while_ddl_is_parsed_and_ddl_size_is_bounded(
    trained, tokenizer, monkeypatch
):
    """Issue item 6: DDL is parsed off the event loop, and its length is capped where the
    parse cost grows. The parse is held at a gate (no timing): /health must answer while it
    waits; parsed on the event loop, the server could not answer until the gate opens."""
    import httpx

    from sqlrl import request_input as prompting

    parse, parsing, release = prompting.schema_from_ddl, threading.Event(), threading.Event()

    def gated_parse(ddl: str, db_id: str = "ddl"):
        parsing.set()
        assert release.wait(120), "the test never opened the gate"
        return parse(ddl, db_id)

    monkeypatch.setattr(prompting, "schema_from_ddl", gated_parse)
    repair = dataclasses.replace(SETTINGS, schema_repair=True)
    app = scripted_app(trained, tokenizer, ScriptedGenerator(), prompt_settings=repair)
    with serving(app) as base:

        async def scenario():
            async with httpx.AsyncClient(base_url=base, timeout=120) as http:
                post = asyncio.ensure_future(
                    http.post("/generate", json={"question": Q, "ddl": CONCERT_DDL})
                )
                try:
                    loop = asyncio.get_running_loop()
                    assert await loop.run_in_executor(None, parsing.wait, 60), "no parse began"
                    health = await asyncio.wait_for(http.get("/health"), timeout=20)
                    answered_before_release = not post.done()
                finally:
                    release.set()
                return health, answered_before_release, await post

        health, answered_before_release, response = asyncio.run(scenario())
    assert health.status_code == 200 and answered_before_release
    assert response.status_code == 200, response.text
    with TestClient(scripted_app(trained, tokenizer, ScriptedGenerator()), base_url=LOCAL_URL) as c:
        r = c.post("/generate", json={"question": Q, "ddl": CONCERT_DDL * 50})
    assert r.status_code == 413
    assert r.json()["detail"] == (
        f"ddl is {len(CONCERT_DDL) * 50} characters, over the server's limit of 32000"
    )
