"""/docs and /redoc render with no network: their scripts come from the installed
fastapi-offline wheel, served by this server (Swagger UI's default loads them from a CDN, and
the page stays blank offline)."""

from __future__ import annotations

import re

import httpx
import pytest
from selenium.webdriver.common.by import By

from sqlrl.serve import create_app
from tests.serve_helpers import SETTINGS, serve_config, serving, wait_for


@pytest.fixture(scope="module")
def base(trained):
    app = create_app(serve_config(trained), prompt_settings=SETTINGS)
    with serving(app) as url:
        yield url


def test_the_docs_load_nothing_from_elsewhere(base):
    for page in ("/docs", "/redoc"):
        html = httpx.get(base + page).text
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
        assert urls and all(u.startswith("/") for u in urls), urls
        for url in urls:
            assert httpx.get(base + url).status_code == 200, url


def test_swagger_ui_renders_the_api_in_a_browser(browser, base):
    browser.get(base + "/docs")
    title = wait_for(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, ".swagger-ui .info .title"),
        "Swagger UI's title",
    )[0]
    assert "sqlrl text-to-SQL" in title.text
    operations = browser.find_elements(By.CSS_SELECTOR, ".opblock-summary-path")
    paths = {op.get_attribute("data-path") for op in operations}
    assert {"/generate", "/feedback", "/v1/chat/completions"} <= paths, paths
