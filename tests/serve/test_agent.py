"""Serving an agent-format model: /generate and the OpenAI-compatible endpoint run the tool
loop (sqlrl/serve/inference.py) and return the trace next to the answer.

Real: Qwen2.5's tokenizer and template, TRL's parser, the server's batching backend, Spider's
concert_singer, the sandbox. Scripted: the model's turns (tests/scripted_turns.py).
"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from sqlrl.data.prompt_settings import PromptSettings
from sqlrl.formats.agent import AGENT_SYSTEM_PROMPT
from sqlrl.serve import create_app
from sqlrl.serve.backends import BatchingBackend
from tests.scripted_turns import SINGERS, ScriptedGenerator, call
from tests.serve_helpers import DB, LOCAL_URL, ask, serve_config, serving, wait_for

COUNT = "SELECT count(*) FROM singer"
AGENT = PromptSettings("compact", 0, "SQL only.", rollout="agent", max_turns=2)


@pytest.fixture(scope="module")
def tokenizer():
    """Qwen2.5's, with TRL's response parser already set (and TRL imported), as a server that
    has answered once holds it: a live server's start then waits for nothing else."""
    from sqlrl.formats.tool_loop import with_response_parser
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    return with_response_parser(build_qwen25_tokenizer())


def probe_then_answer(prompt, turn, i=0):
    """Looks at the singer count, then answers with it (in a fence, as models do)."""
    return call(COUNT) if turn == 0 else f"```sql\n{COUNT}\n```"


def agent_app(tmp_path, tokenizer, generator, settings=AGENT):
    backend = BatchingBackend(
        generator, tokenizer, name="scripted", model_path=str(tmp_path), max_batch_size=8
    )
    return create_app(serve_config(tmp_path), backend=backend, prompt_settings=settings)


def test_an_agent_model_answers_with_its_trace(tmp_path, tokenizer):
    """The answer is the episode's final SQL, run on the database when asked; the trace shows
    the probe, what the database said and the final SQL; the model's second turn saw the
    observation."""
    generator = ScriptedGenerator(probe_then_answer)
    with TestClient(agent_app(tmp_path, tokenizer, generator), base_url=LOCAL_URL) as client:
        r = client.post(
            "/generate", json={"question": SINGERS, "db_id": "concert_singer", "execute": True}
        )
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["sql"] == COUNT and body["rows"] == [[6]]
        assert body["trace"] == {
            "probes": [{"query": COUNT, "observation": "(1 row)\ncount(*)\n6"}],
            "final_sql": COUNT,
        }
        first, second = (batch[0] for batch in generator.batches)
        assert first.startswith("<|im_start|>system\n" + AGENT_SYSTEM_PROMPT)
        assert "<tool_response>\n(1 row)\ncount(*)\n6\n</tool_response>" in second

        generator.batches.clear()
        r = client.post(
            "/v1/chat/completions",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": SINGERS}],
                "db_id": "concert_singer",
            },
        )
        assert r.status_code == 200, r.text
        chat = r.json()
        assert chat["choices"][0]["message"]["content"] == COUNT
        assert chat["sqlrl"]["trace"]["probes"][0]["observation"] == "(1 row)\ncount(*)\n6"
        prompt = client.get("/health").json()["prompt"]
        assert prompt["rollout"] == "agent" and prompt["max_turns"] == 2


def test_an_agent_out_of_turns_answers_no_sql_and_ddl_requests_have_no_database(
    tmp_path, tokenizer
):
    """A model that only probes ends with no SQL, and says so in the trace; a DDL request has
    no database for the tool, so each probe answers an error observation."""
    generator = ScriptedGenerator(lambda prompt, turn, i=0: call(COUNT))
    ddl = "CREATE TABLE singer (Singer_ID INT PRIMARY KEY, Name TEXT);"
    with TestClient(agent_app(tmp_path, tokenizer, generator), base_url=LOCAL_URL) as client:
        r = client.post("/generate", json={"question": SINGERS, "ddl": ddl})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["sql"] == "" and body["trace"]["final_sql"] == ""
        observations = [p["observation"] for p in body["trace"]["probes"]]
        assert observations == ["error: no database for this question"] * 2


def test_a_sql_model_has_no_trace(tmp_path, tokenizer):
    generator = ScriptedGenerator(lambda prompt, turn, i=0: COUNT)
    settings = PromptSettings("compact", 0, "SQL only.")
    with TestClient(
        agent_app(tmp_path, tokenizer, generator, settings), base_url=LOCAL_URL
    ) as client:
        body = client.post("/generate", json={"question": SINGERS, "db_id": "concert_singer"})
        assert body.json()["sql"] == COUNT and "trace" not in body.json()
        assert "<tools>" not in generator.batches[0][0]
        assert "rollout" not in client.get("/health").json()["prompt"]  # as before formats


def test_the_playground_shows_an_agent_models_trace(browser, tmp_path, tokenizer):
    """A person asking an agent model sees each probe, what the database answered and the
    final SQL under the answer."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    app = agent_app(tmp_path, tokenizer, ScriptedGenerator(probe_then_answer))
    with serving(app) as base:
        browser.get(base + "/")
        wait_for(
            browser,
            lambda d: d.find_elements(By.CSS_SELECTOR, f"#db option[value={DB}]"),
            "the databases",
        )
        Select(browser.find_element(By.ID, "db")).select_by_value(DB)
        ask(browser, SINGERS, COUNT)
        box = browser.find_element(By.ID, "trace-box")
        assert box.get_property("hidden") is False
        box.find_element(By.TAG_NAME, "summary").click()
        queries = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#trace .probe-query")]
        seen = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#trace .probe-observation")]
        assert queries == [COUNT] and seen == ["(1 row)\ncount(*)\n6"]
        assert browser.find_element(By.CSS_SELECTOR, "#trace .final-sql").text == (
            "answer: " + COUNT
        )
