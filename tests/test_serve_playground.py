"""The playground page (GET /) in a real headless browser: Debian's chromium driven by
Selenium through chromedriver, against a live server on loopback with an API key and a
feedback database. A person's path: enter the key, pick a Spider database, ask, run the SQL,
see the rows, correct the SQL and save the correction, which lands in the feedback file.

Skipped only where no browser is installed (`.ci/run` installs chromium and chromium-driver).
`SQLRL_PLAYGROUND_SCREENSHOT=docs/playground.png pytest tests/test_serve_playground.py`
also saves the screenshot the README shows.
"""

from __future__ import annotations

import io
import os
import shutil
import sqlite3
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service as DriverService
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from sqlrl.serve import create_app
from tests.serve_helpers import (
    CONCERT_DDL,
    COUNT_SQL,
    NAME_SQL,
    PAIRS,
    SETTINGS,
    serve_config,
    serving,
    trained_model,
)

KEY = "playground-key"
DB = "concert_singer"
BROWSERS = ("chromium", "chromium-browser", "google-chrome")
SCREENSHOT_MAX_BYTES = 200_000


def browser_paths() -> tuple[str, str] | None:
    """(browser, chromedriver) where both are installed, else None."""
    browser = next((p for p in map(shutil.which, BROWSERS) if p), None)
    driver = shutil.which("chromedriver")
    return (browser, driver) if browser and driver else None


@pytest.fixture(scope="module")
def browser():
    paths = browser_paths()
    if paths is None:
        pytest.skip(
            "no headless browser: install Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver; .ci/run does)"
        )
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


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A live server with an API key and a feedback file: (base URL, feedback file)."""
    feedback = tmp_path_factory.mktemp("feedback") / "feedback.sqlite"
    config = serve_config(trained_model(tmp_path_factory), api_key=KEY, feedback_db=str(feedback))
    with serving(create_app(config, prompt_settings=SETTINGS)) as base:
        yield base, feedback


def wait_for(driver, condition, what: str, timeout: float = 60):
    return WebDriverWait(driver, timeout).until(
        lambda d: condition(d), message=f"waiting for {what}"
    )


def text(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def ask(driver, question: str, sql: str) -> None:
    box = driver.find_element(By.ID, "question")
    box.clear()
    box.send_keys(question)
    driver.find_element(By.ID, "ask").click()
    wait_for(
        driver,
        lambda d: d.find_element(By.ID, "sql").get_property("value") == sql,
        f"the SQL {sql!r}",
    )


def run_sql(driver) -> list[list[str]]:
    """Click Run; the rows table once it shows the result, as text."""
    driver.find_element(By.ID, "run").click()
    wait_for(driver, lambda d: "row" in text(d, "rows-note"), "the rows")
    table = driver.find_element(By.ID, "rows")
    header = [th.text for th in table.find_elements(By.CSS_SELECTOR, "thead th")]
    body = [
        [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
        for tr in table.find_elements(By.CSS_SELECTOR, "tbody tr")
    ]
    return [header, *body]


def save_screenshot(driver, path: Path) -> None:
    """The page as a PNG of at most SCREENSHOT_MAX_BYTES (a 128-colour palette: flat UI)."""
    from PIL import Image

    image = Image.open(io.BytesIO(driver.get_screenshot_as_png())).convert("RGB")
    small = image.quantize(colors=128, method=Image.Quantize.MEDIANCUT)
    path.parent.mkdir(parents=True, exist_ok=True)
    small.save(path, optimize=True)
    assert path.stat().st_size < SCREENSHOT_MAX_BYTES, path.stat().st_size


def test_a_person_asks_runs_sees_rows_and_stores_a_correction(browser, site, tmp_path):
    base, feedback = site
    browser.get(base + "/")
    assert "401" in wait_for(browser, lambda d: text(d, "status"), "the key refusal")  # no key yet
    key = browser.find_element(By.ID, "key")
    key.send_keys(KEY, Keys.TAB)  # the change event reloads the databases with the key
    wait_for(
        browser,
        lambda d: d.find_elements(By.CSS_SELECTOR, f"#db option[value={DB}]"),
        "the databases",
    )
    Select(browser.find_element(By.ID, "db")).select_by_value(DB)

    ask(browser, PAIRS[3][0], NAME_SQL)
    table = run_sql(browser)
    assert table[0] == ["Name"] and len(table) == 1 + 9 and ["Stark's Park"] in table[1:]
    shot = Path(os.environ.get("SQLRL_PLAYGROUND_SCREENSHOT") or tmp_path / "playground.png")
    save_screenshot(browser, shot)

    ask(browser, PAIRS[0][0], COUNT_SQL)
    assert run_sql(browser) == [["count(*)"], ["6"]]
    save = browser.find_element(By.ID, "save-correction")
    assert not save.is_enabled()  # nothing corrected yet
    corrected = "SELECT count(*) FROM singer WHERE Age > 30"
    editor = browser.find_element(By.ID, "sql")
    editor.clear()
    editor.send_keys(corrected)
    assert run_sql(browser) == [["count(*)"], ["4"]]
    save.click()
    wait_for(
        browser, lambda d: "saved your correction" in text(d, "feedback-status"), "the saved note"
    )

    with sqlite3.connect(feedback) as conn:
        stored = conn.execute(
            "SELECT db_id, question, predicted_sql, verdict, corrected_sql FROM feedback"
        ).fetchall()
    assert stored == [(DB, PAIRS[0][0], COUNT_SQL, "wrong", corrected)]

    # a schema pasted as CREATE TABLE statements: the SQL, no database to run it on, a verdict
    browser.find_element(By.ID, "source-ddl").click()
    browser.find_element(By.ID, "ddl").send_keys(CONCERT_DDL)
    ask(browser, PAIRS[4][0], NAME_SQL)
    assert not browser.find_element(By.ID, "run").is_enabled()
    browser.find_element(By.ID, "right").click()
    wait_for(browser, lambda d: 'saved your "right"' in text(d, "feedback-status"), "the verdict")
    with sqlite3.connect(feedback) as conn:
        last = conn.execute(
            "SELECT db_id, ddl, question, verdict FROM feedback WHERE id = 2"
        ).fetchall()
    assert last == [(None, CONCERT_DDL, PAIRS[4][0], "right")]
    severe = [
        e
        for e in browser.get_log("browser")
        if e["level"] == "SEVERE" and "401" not in e["message"]
    ]
    assert severe == []  # no script error, nothing the page's policy had to block
