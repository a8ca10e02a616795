"""Feedback is training data: a web page elsewhere cannot write it through a user's browser,
and the server says who wrote each record (sqlrl/serve/trust.py). The attacks of issue 44
against a real `python -m sqlrl.serve` process in its default set-up (no API key, loopback):
the `curl` with a forged Origin and a text/plain body, a form post, a request naming another
host, and a page on another local port posting with `fetch(..., {mode: "no-cors"})` in
headless Chromium. None is stored, and the export finds nothing."""

from __future__ import annotations

import contextlib
import json
import sqlite3
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from sqlrl.serve.cli import for_bind_address
from sqlrl.serve.config import ServeConfig
from sqlrl.serve.trust import PAGE_TOKEN_HEADER, PageTokens, host_name, key_id
from tests.repo_tools import REPO_ROOT, SPIDER_DIR
from tests.serve_helpers import COUNT_SQL, DB, PAIRS, page_token, server_process, wait_for

POISON = {
    "db_id": DB,
    "question": "How many singers do we have?",
    "predicted_sql": "SELECT 1",
    "verdict": "wrong",
    "corrected_sql": "SELECT Name FROM singer",
}


@pytest.fixture(scope="module")
def local_server(trained, tmp_path_factory):
    """The README's set-up: no API key, loopback, a feedback file: (base URL, feedback file)."""
    feedback = tmp_path_factory.mktemp("trust") / "feedback.sqlite"
    with server_process(trained, "--feedback-db", str(feedback)) as (_, base):
        yield base, feedback


def stored(feedback) -> list[tuple]:
    with sqlite3.connect(feedback) as conn:
        return conn.execute("SELECT id, writer, question FROM feedback").fetchall()


def curl(*args: str) -> tuple[int, dict]:
    """curl as the issue ran it: (status, JSON body)."""
    out = subprocess.run(
        ["curl", "-s", "-w", "\n%{http_code}", *args], capture_output=True, text=True, timeout=60
    ).stdout
    body, _, status = out.rpartition("\n")
    return int(status), json.loads(body)


def test_cross_origin_and_non_json_writes_are_refused_and_nothing_is_stored(local_server):
    base, feedback = local_server
    poison = json.dumps(POISON)
    cases = [  # (curl arguments, status, what the refusal says)
        (["-H", "Content-Type: text/plain", "-H", "Origin: https://evil.example"], 403, "evil"),
        (["-H", "Content-Type: text/plain"], 415, "Content-Type: application/json"),
        (["-H", "Content-Type: application/x-www-form-urlencoded"], 415, "application/json"),
        (["-H", "Content-Type: application/json", "-H", "Origin: null"], 403, "may not write"),
        (["-H", "Content-Type: application/json", "-H", "Host: evil.example"], 400, "host"),
        # JSON from a local program, no Origin, no key, no page token: not the page
        (["-H", "Content-Type: application/json"], 403, "reload the page"),
        (["-H", "Content-Type: application/json", "-H", f"{PAGE_TOKEN_HEADER}: x.y"], 403, ""),
    ]
    for args, status, fragment in cases:
        got, body = curl(base + "/feedback", *args, "-d", poison)
        assert (got, fragment in body["detail"]) == (status, True), (args, body)
    # the same Origin checks on the other routes that POST
    got, _ = curl(base + "/execute", "-H", "Origin: http://127.0.0.1:1", "-d", "{}")
    assert got == 403
    assert stored(feedback) == []
    # the page's own writes work: its token, and its own Origin (what Chromium sends)
    with httpx.Client(base_url=base) as client:
        token = page_token(client)
        question, sql = PAIRS[0]
        r = client.post(
            "/feedback",
            json={"db_id": DB, "question": question, "predicted_sql": sql, "verdict": "right"},
            headers={PAGE_TOKEN_HEADER: token, "Origin": base},
        )
    assert r.status_code == 200 and r.json()["writer"] == "local page", r.text
    assert [(w, q) for _, w, q in stored(feedback)] == [("local page", question)]

    out = feedback.parent / "verified.json"
    cmd = [sys.executable, "-m", "sqlrl.feedback", "export", "--db", str(feedback)]
    cmd += ["--spider", str(SPIDER_DIR), "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert [item["query"] for item in json.loads(out.read_text())] == [COUNT_SQL]


ATTACK_PAGE = """<!doctype html><title>a page elsewhere</title>
<form id="f" method="post" action="{target}/feedback" target="sink" enctype="text/plain">
<input type="hidden" name='{field}' value='"}}'></form>
<iframe name="sink"></iframe>
<script>
const body = JSON.stringify({poison});
Promise.allSettled([
  fetch("{target}/feedback", {{method: "POST", mode: "no-cors", body,
    headers: {{"Content-Type": "text/plain"}}}}),
  fetch("{target}/feedback", {{method: "POST", mode: "no-cors", body}}),
  fetch("{target}/feedback", {{method: "POST", body,
    headers: {{"Content-Type": "application/json"}}}}),
  fetch("{target}/").then(r => r.text()),
]).then(results => {{
  document.getElementById("f").submit();
  document.title = "done " + results.map(r => r.status).join(",");
}});
</script>"""


@contextlib.contextmanager
def page_elsewhere(html: str):
    """`html` served at / by a plain HTTP server on another loopback port: its URL."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            data = html.encode()
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def test_a_page_on_another_port_cannot_write_feedback_through_the_browser(
    browser,
    local_server,
):
    """Chromium on a page served from another local port: no-cors fetches (text/plain and
    the default type), a CORS fetch with JSON (its preflight gets no permission), and a form
    post; it cannot read our page's token either (the fetch of / is opaque to it)."""
    base, feedback = local_server
    before = stored(feedback)
    # a text/plain form posts `name=value`: a name that makes the body read as JSON
    field = json.dumps(POISON)[:-1] + ', "x": "'
    html = ATTACK_PAGE.format(target=base, poison=json.dumps(POISON), field=field)
    with page_elsewhere(html) as url:
        browser.get(url)
        title = wait_for(browser, lambda d: d.title.startswith("done") and d.title, "the attack")
    # the CORS fetches were blocked by the browser (rejected), the no-cors ones got opaque
    # answers; the server refused each (the form's refusal is shown in the frame)
    assert title == "done fulfilled,fulfilled,rejected,rejected", title
    browser.switch_to.frame("sink")
    assert "may not write" in wait_for(
        browser, lambda d: "detail" in d.page_source and d.page_source, "the form's answer"
    )
    browser.switch_to.default_content()
    assert stored(feedback) == before


# --------------------------------------------------------------------------- units


def test_hosts_the_server_answers_to_and_the_bind_address():
    assert [host_name(h) for h in ("127.0.0.1:8000", "LOCALHOST", "[::1]:80", "a.b")] == [
        "127.0.0.1",
        "localhost",
        "::1",
        "a.b",
    ]
    with pytest.raises(ValueError, match="without an API key"):
        for_bind_address(ServeConfig(), "0.0.0.0")
    with pytest.raises(ValueError, match="SQLRL_API_KEY"):
        for_bind_address(ServeConfig(), "192.168.1.5")
    assert for_bind_address(ServeConfig(), "127.0.0.2").allowed_hosts is None
    assert for_bind_address(ServeConfig(api_key="k"), "0.0.0.0").allowed_hosts == "*"
    assert for_bind_address(ServeConfig(api_key="k"), "10.0.0.7").allowed_hosts == "10.0.0.7"
    named = ServeConfig(api_key="k", allowed_hosts="sql.example.com")
    assert for_bind_address(named, "0.0.0.0").allowed_hosts == "sql.example.com"


def test_page_tokens_are_signed_by_this_server_run():
    tokens, other = PageTokens(), PageTokens()
    token = tokens.issue()
    assert tokens.valid(token) and tokens.issue() != token
    assert not other.valid(token)  # a restarted server: the page must be reloaded
    nonce, _, signature = token.partition(".")
    assert not tokens.valid(nonce + "." + signature[::-1])
    assert not tokens.valid(None) and not tokens.valid("") and not tokens.valid("é.é")
    assert key_id("s3cret").startswith("key:") and "s3cret" not in key_id("s3cret")


def test_serving_beyond_this_machine_without_a_key_is_refused(tmp_path, capsys):
    from sqlrl.serve.cli import main

    assert main(["--model", str(tmp_path), "--host", "0.0.0.0"]) == 2
    assert "without an API key" in capsys.readouterr().err
