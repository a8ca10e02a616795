"""Fixtures the serving tests share: the tiny model trained to answer PAIRS
(tests/serve_helpers.py), trained once per session, and a client of the app serving it."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from sqlrl.serve import create_app
from tests.serve_helpers import LOCAL_URL, SETTINGS, serve_config, train_served_model


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
