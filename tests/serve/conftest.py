"""Fixtures the serving tests share: the tiny model trained to answer PAIRS
(tests/serve_helpers.py), trained once per session, a client of the app serving it, and the
headless browser the page tests drive."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from sqlrl.serve import create_app
from tests.serve_helpers import (
    LOCAL_URL,
    SETTINGS,
    browser_paths,
    serve_config,
    train_served_model,
)


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    """A tiny model trained until it answers PAIRS exactly (greedy), saved like models/final."""
    return train_served_model(tmp_path_factory.mktemp("served_model"))


@pytest.fixture(scope="module")
def client(trained):
    """A TestClient of the app serving `trained` with the transformers backend."""
    app = create_app(serve_config(trained), prompt_settings=SETTINGS)
    with TestClient(app, base_url=LOCAL_URL) as c:
        yield c


@pytest.fixture(scope="module")
def tokenizer(trained):
    """The trained model's tokenizer (the scripted backends tokenize with it)."""
    from sqlrl.model.modeling import load_tokenizer

    return load_tokenizer(trained)


@pytest.fixture(scope="module")
def browser():
    """A headless Chromium (Selenium), one per module; skipped where none is installed."""
    paths = browser_paths()
    if paths is None:
        pytest.skip(
            "no headless browser: install Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver; .ci/run does)"
        )
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service as DriverService

    options = webdriver.ChromeOptions()
    options.binary_location = paths[0]
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1100,1000",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=DriverService(paths[1]), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()
