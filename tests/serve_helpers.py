"""What the serving tests share: a tiny model trained to answer Spider questions, its server
settings, a scripted generator behind the server's batching backend, and a real uvicorn server
on loopback.

The `trained` fixture (tests/serve/conftest.py) trains the model once per test session (a few
seconds) for every test module that serves it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from sqlrl.data.prompt_settings import write_prompt_settings
from sqlrl.request_input import RequestInput
from sqlrl.serve import PromptSettings, ServeConfig, create_app
from sqlrl.serve.backends import BatchingBackend
from tests.repo_tools import REPO_ROOT, SPIDER_DIR, tiny_arch

# the server answers to loopback names only (sqlrl.serve.trust); TestClient's default
# host, "testserver", is not one
LOCAL_URL = "http://127.0.0.1"
SETTINGS = PromptSettings("compact", 0, "You are a text-to-SQL assistant.")
COUNT_SQL = "SELECT count(*) FROM singer"
NAME_SQL = "SELECT Name FROM stadium"
PAIRS = [
    ("How many singers do we have?", COUNT_SQL),
    ("What is the total number of singers?", COUNT_SQL),
    ("Count the singers.", COUNT_SQL),
    ("List the names of all stadiums.", NAME_SQL),
    ("What are the stadium names?", NAME_SQL),
    ("Show every stadium name.", NAME_SQL),
]
Q = PAIRS[0][0]  # the question most serving tests ask
DB = "concert_singer"  # the database PAIRS ask about
BROWSERS = ("chromium", "chromium-browser", "google-chrome")  # what the page tests drive
CONCERT_DDL = """
CREATE TABLE stadium (Stadium_ID INT PRIMARY KEY, Location TEXT, Name TEXT, Capacity INT,
  Highest INT, Lowest INT, Average INT);
CREATE TABLE singer (Singer_ID INT, Name TEXT, Country TEXT, Song_Name TEXT,
  Song_release_year TEXT, Age INT, Is_male BOOLEAN, PRIMARY KEY (Singer_ID));
CREATE TABLE concert (concert_ID INT PRIMARY KEY, concert_Name TEXT, Theme TEXT,
  Stadium_ID TEXT REFERENCES stadium(Stadium_ID), Year TEXT);
CREATE TABLE singer_in_concert (concert_ID INT, Singer_ID TEXT,
  PRIMARY KEY (concert_ID, Singer_ID),
  FOREIGN KEY (concert_ID) REFERENCES concert(concert_ID),
  FOREIGN KEY (Singer_ID) REFERENCES singer(Singer_ID));
CREATE INDEX ignored ON singer(Name);
"""


def served_arch():
    """A Qwen2 small enough to train in seconds on a CPU: the tests' tiny one, twice as wide."""
    return dataclasses.replace(tiny_arch(), hidden_size=64, intermediate_size=128)


def save_prompt_settings(model_dir, settings: PromptSettings) -> None:
    """What the sft stage does: the prompt settings of training saved with the model."""
    from tests.repo_tools import fixed_params

    prepare = dataclasses.replace(
        fixed_params().prepare,
        schema_format=settings.schema_format,
        sample_rows=settings.sample_rows,
        system_prompt=settings.system_prompt,
        mark_schema_mentions=settings.mark_schema_mentions,
        max_prompt_tokens=settings.max_prompt_tokens,
    )
    write_prompt_settings(model_dir, prepare, settings.schema_repair)


def train_served_model(path: Path, arch=None) -> Path:
    """A tiny model (`arch`, else served_arch()) trained until it answers PAIRS exactly (greedy),
    saved like models/final in `path`."""
    from sqlrl.data.prompts import render_prompt
    from sqlrl.model.modeling import build_scratch_model, to_transformers_tokenizer, train_tokenizer

    builder = RequestInput(SETTINGS, SPIDER_DIR)
    messages = [builder.messages(q, db_id="concert_singer") for q, _ in PAIRS]
    texts = [m["content"] for ms in messages for m in ms] + [sql for _, sql in PAIRS]
    arch = arch or served_arch()
    tokenizer = to_transformers_tokenizer(train_tokenizer(texts * 5, arch.vocab_size))
    model = build_scratch_model(arch, tokenizer, seed=0)
    seqs = [
        (
            tokenizer(render_prompt(tokenizer, m), add_special_tokens=False)["input_ids"],
            tokenizer(sql + "<|im_end|>", add_special_tokens=False)["input_ids"],
        )
        for m, (_, sql) in zip(messages, PAIRS, strict=False)
    ]
    width = max(len(a) + len(b) for a, b in seqs)
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    labels = torch.full((len(seqs), width), -100)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (a, b) in enumerate(seqs):
        ids[i, : len(a) + len(b)] = torch.tensor(a + b)
        mask[i, : len(a) + len(b)] = 1
        labels[i, len(a) : len(a) + len(b)] = torch.tensor(b)
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: one thread is fastest, and robust on a busy CPU
    try:
        exact_steps = _train(model, optimizer, ids, mask, labels)
    finally:
        torch.set_num_threads(threads)
    assert exact_steps >= 3, "the fixture model did not learn its completions"
    model.eval().save_pretrained(path)
    tokenizer.save_pretrained(path)
    save_prompt_settings(path, SETTINGS)
    return path


def _train(model, optimizer, ids, mask, labels) -> int:
    """Full-weight steps until every completion token is the argmax three steps running."""
    exact_steps = 0
    for _ in range(300):
        out = model(input_ids=ids, attention_mask=mask, labels=labels)
        pred, target = out.logits[:, :-1].argmax(-1), labels[:, 1:]
        scored = target != -100
        exact_steps = exact_steps + 1 if bool((pred[scored] == target[scored]).all()) else 0
        if exact_steps >= 3:  # every completion token is the argmax, with a margin
            break
        optimizer.zero_grad()
        out.loss.backward()
        optimizer.step()
    return exact_steps


def serve_config(model_dir, **kw) -> ServeConfig:
    """The tests' server settings: the fixture model, the real Spider, short answers, on
    transformers (the default `auto` would take vLLM where vLLM's CPU build is installed, and
    the fast tier's tiny models have a head_dim its CPU attention refuses; the vLLM tests ask
    for backend="vllm" with models it runs)."""
    base = dict(
        model=str(model_dir),
        backend="transformers",
        spider_dir=str(SPIDER_DIR),
        max_new_tokens=24,
        max_batch_size=8,
        request_timeout_s=60.0,
        warmup=False,
    )
    return ServeConfig(**{**base, **kw})


class ScriptedGenerator:
    """A Generator double: waits, fails or answers, as told."""

    def __init__(self, delay: float = 0.0, error: Exception | None = None, text: str = "SELECT 1"):
        self.delay, self.error, self.text = delay, error, text
        self.calls: list[int] = []
        self.prompts: list[str] = []
        self.release = threading.Event()

    def generate(self, prompts):
        self.calls.append(len(prompts))
        self.prompts.extend(prompts)
        if self.delay:
            self.release.wait(self.delay)
        if self.error:
            raise self.error
        return [self.text] * len(prompts)

    def sample(self, prompts, n, temperature, seed):
        return [[self.text] * n for _ in self.generate(prompts)]


def scripted_app(trained, tokenizer, generator, **kw):
    """The app on `generator` behind the server's batching backend (no model runs); `kw` sets
    the backend's max_batch_size and max_queue, the prompt settings and ServeConfig fields."""
    backend = BatchingBackend(
        generator,
        tokenizer,
        name="scripted",
        model_path=str(trained),
        max_batch_size=kw.pop("max_batch_size", 8),
        max_queue=kw.pop("max_queue", 16),
    )
    settings = kw.pop("prompt_settings", SETTINGS)
    return create_app(serve_config(trained, **kw), backend=backend, prompt_settings=settings)


@contextlib.contextmanager
def serving(app):
    """`app` on a real uvicorn server with the settings `python -m sqlrl.serve` runs
    (cli.uvicorn_config), in a thread; yields the base URL."""
    import uvicorn

    from sqlrl.serve.cli import uvicorn_config

    server = uvicorn.Server(uvicorn_config(app, port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert not thread.is_alive()


def page_token(client) -> str:
    """The session token of the playground page `client` is served, as the page reads it."""
    import re

    html = client.get("/").text
    return re.search(r'<meta name="sqlrl-page-token" content="([^"]+)">', html).group(1)


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def server_process(model_dir: Path, *flags: str):
    """`python -m sqlrl.serve` as its own process on a free loopback port, as a user starts
    it; yields (process, base URL) once /health answers. Killed at the end if still alive."""
    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "sqlrl.serve", "--model", str(model_dir)]
    cmd += ["--spider-dir", str(SPIDER_DIR), "--port", str(port), "--warmup", "false"]
    cmd += ["--log-level", "warning", *flags]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SQLRL_TORCH_THREADS": "1"}
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"the server exited: {proc.stderr.read()[-3000:]}"
            assert time.monotonic() < deadline, "the server did not start within 120 s"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(base + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.2)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)
        proc.stderr.close()


def browser_paths() -> tuple[str, str] | None:
    """(browser, chromedriver) where both are installed, else None."""
    browser = next((p for p in map(shutil.which, BROWSERS) if p), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


def wait_for(driver, condition, what: str, timeout: float = 60):
    """What `condition(driver)` returns once truthy, waited for up to `timeout` seconds."""
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout).until(
        lambda d: condition(d), message=f"waiting for {what}"
    )


def ask(driver, question: str, sql: str) -> None:
    """Ask `question` on the playground page and wait until it shows `sql`."""
    from selenium.webdriver.common.by import By

    box = driver.find_element(By.ID, "question")
    box.clear()
    box.send_keys(question)
    driver.find_element(By.ID, "ask").click()
    wait_for(
        driver,
        lambda d: d.find_element(By.ID, "sql").get_property("value") == sql,
        f"the SQL {sql!r}",
    )
