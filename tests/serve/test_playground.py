"""The playground page (GET /) in a real headless browser: Debian's chromium driven by
Selenium through chromedriver, against live servers on loopback with a feedback database:
one with an API key (`site`), one set up as by default, without a key (`local_site`). A
person's path: enter the key, pick a Spider database (its tables are shown), ask, run the
SQL, see the rows, correct the SQL and save the correction, which lands in the feedback file.
And a page that cannot mislead: an answer is cleared (its buttons disabled) when the question
or the schema it was about changes or an ask fails, notices go when the SQL is edited, and a
correction that does not run is refused with its error, the earlier verdict kept.

Skipped only where no browser is installed (`.ci/run` installs chromium and chromium-driver).
`SQLRL_PLAYGROUND_SCREENSHOT=docs/playground.png pytest tests/serve/test_playground.py`
also saves the screenshot the README shows.
"""

from __future__ import annotations

import contextlib
import io
import os
import sqlite3
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from sqlrl.serve import create_app
from tests.serve_helpers import (
    CONCERT_DDL,
    COUNT_SQL,
    DB,
    NAME_SQL,
    PAIRS,
    SETTINGS,
    ask,
    serve_config,
    serving,
    wait_for,
)

KEY = "playground-key"
OTHER_DB = "pets_1"  # tables Student, Has_Pet, Pets
MAX_QUESTION_CHARS = 60  # local_site's limit: longer than every question of PAIRS
ANSWER_BUTTONS = ("run", "right", "wrong", "save-correction")
SCREENSHOT_MAX_BYTES = 200_000


@pytest.fixture(scope="module")
def site(trained, tmp_path_factory):
    """A live server with an API key and a feedback file: (base URL, feedback file)."""
    feedback = tmp_path_factory.mktemp("feedback") / "feedback.sqlite"
    config = serve_config(trained, api_key=KEY, feedback_db=str(feedback))
    with serving(create_app(config, prompt_settings=SETTINGS)) as base:
        yield base, feedback


@pytest.fixture(scope="module")
def local_site(trained, tmp_path_factory):
    """The default set-up: no API key, so the server takes feedback only from its own page
    (with the page's token), stored as written by "local page"; questions of at most
    MAX_QUESTION_CHARS characters. (base URL, feedback file)."""
    feedback = tmp_path_factory.mktemp("local_feedback") / "feedback.sqlite"
    config = serve_config(
        trained,
        feedback_db=str(feedback),
        max_question_chars=MAX_QUESTION_CHARS,
    )
    with serving(create_app(config, prompt_settings=SETTINGS)) as base:
        yield base, feedback


def text(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).text


def open_page(driver, base: str, key: str | None = None) -> None:
    """The playground at `base`, the key entered (unless the tab remembers it), DB selected."""
    driver.get(base + "/")
    box = driver.find_element(By.ID, "key")
    if key and box.get_property("value") != key:
        box.clear()
        box.send_keys(key, Keys.TAB)
    wait_for(
        driver,
        lambda d: d.find_elements(By.CSS_SELECTOR, f"#db option[value={DB}]"),
        "the databases",
    )
    Select(driver.find_element(By.ID, "db")).select_by_value(DB)


def value(driver, element_id: str) -> str:
    return driver.find_element(By.ID, element_id).get_property("value")


def enabled_buttons(driver) -> list[str]:
    """Which of the answer's buttons can be clicked."""
    return [b for b in ANSWER_BUTTONS if driver.find_element(By.ID, b).is_enabled()]


def assert_no_answer(driver) -> None:
    """Nothing on screen claims to answer the question: no SQL, rows, notice, or button."""
    assert value(driver, "sql") == ""
    assert driver.find_elements(By.CSS_SELECTOR, "#rows tr") == []
    assert text(driver, "rows-note") == "" and text(driver, "feedback-status") == ""
    assert enabled_buttons(driver) == []


def edit_sql(driver, sql: str) -> None:
    """Replace the SQL in the box by typing (the way a person corrects it)."""
    editor = driver.find_element(By.ID, "sql")
    editor.clear()
    editor.send_keys(sql)


def last_id(feedback: Path) -> int:
    with contextlib.closing(sqlite3.connect(feedback)) as conn:
        return conn.execute("SELECT coalesce(max(id), 0) FROM feedback").fetchone()[0]


def feedback_since(feedback: Path, after: int, columns: str) -> list[tuple]:
    """`columns` of the records stored after record `after`, oldest first."""
    with contextlib.closing(sqlite3.connect(feedback)) as conn:
        return conn.execute(
            f"SELECT {columns} FROM feedback WHERE id > ? ORDER BY id", (after,)
        ).fetchall()


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
    """The whole path with an API key: refused until the key is typed, then an answer, its
    rows, a correction run and saved, and a verdict on an answer about pasted DDL."""
    base, feedback = site
    browser.get(base + "/")
    browser.execute_script("sessionStorage.clear()")  # a tab that never saw the key
    browser.get_log("browser")  # drop what earlier tests logged (their refusals)
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
    wait_for(browser, lambda d: "singer_in_concert" in text(d, "schema"), "the schema")
    before = last_id(feedback)

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
    edit_sql(browser, corrected)
    assert run_sql(browser) == [["count(*)"], ["4"]]
    save.click()
    wait_for(
        browser, lambda d: "saved your correction" in text(d, "feedback-status"), "the saved note"
    )
    assert not save.is_enabled()  # saving it twice would store it twice
    columns = "db_id, question, predicted_sql, verdict, corrected_sql"
    assert feedback_since(feedback, before, columns) == [
        (DB, PAIRS[0][0], COUNT_SQL, "wrong", corrected)
    ]

    # a schema pasted as CREATE TABLE statements: the SQL, no database to run it on, a verdict
    browser.find_element(By.ID, "source-ddl").click()
    assert not browser.find_element(By.ID, "schema-box").is_displayed()
    browser.find_element(By.ID, "ddl").send_keys(CONCERT_DDL)
    ask(browser, PAIRS[4][0], NAME_SQL)
    assert not browser.find_element(By.ID, "run").is_enabled()
    browser.find_element(By.ID, "right").click()
    wait_for(browser, lambda d: 'saved your "right"' in text(d, "feedback-status"), "the verdict")
    stored = feedback_since(feedback, before, "db_id, ddl, question, verdict, writer")
    assert stored[1:] == [(None, CONCERT_DDL, PAIRS[4][0], "right", stored[0][4])]
    assert stored[0][4].startswith("key:")  # the key's id, never the key
    severe = [
        e
        for e in browser.get_log("browser")
        if e["level"] == "SEVERE" and "401" not in e["message"]
    ]
    assert severe == []  # no script error, nothing the page's policy had to block


def test_changing_the_database_or_schema_source_clears_the_answer(browser, site):
    """An answer about concert_singer disappears, with its rows and buttons, the moment
    another database (or pasted DDL) is picked: Run cannot query a database the answer was
    not about, and Right/Wrong cannot file it under the wrong one."""
    base, _ = site
    open_page(browser, base, KEY)
    ask(browser, PAIRS[0][0], COUNT_SQL)
    assert run_sql(browser) == [["count(*)"], ["6"]]
    assert "concert_singer" in text(browser, "meta")  # what the answer is about
    assert enabled_buttons(browser) == ["run", "right", "wrong"]

    Select(browser.find_element(By.ID, "db")).select_by_value(OTHER_DB)
    assert_no_answer(browser)
    assert "database changed" in text(browser, "status")
    Select(browser.find_element(By.ID, "db")).select_by_value(DB)  # back: still no answer
    assert_no_answer(browser)

    ask(browser, PAIRS[0][0], COUNT_SQL)
    assert enabled_buttons(browser) == ["run", "right", "wrong"]
    browser.find_element(By.ID, "source-ddl").click()
    assert_no_answer(browser)
    assert "schema changed" in text(browser, "status")


def test_editing_the_question_clears_the_answer_but_editing_the_sql_does_not(browser, site):
    """Typing in the SQL box is a correction: the answer and its buttons stay. Typing in the
    question box makes it another question: the old answer goes."""
    base, _ = site
    open_page(browser, base, KEY)
    ask(browser, PAIRS[0][0], COUNT_SQL)
    browser.find_element(By.ID, "sql").send_keys(" WHERE Age > 30")
    assert value(browser, "sql") == COUNT_SQL + " WHERE Age > 30"
    assert enabled_buttons(browser) == list(ANSWER_BUTTONS)

    browser.find_element(By.ID, "question").send_keys(" Over 30?")
    assert_no_answer(browser)
    assert "question changed" in text(browser, "status")


def test_a_failed_ask_clears_the_previous_answer_and_stores_nothing(browser, local_site):
    """A question over the server's length limit is refused (413): the page shows why, and
    the previous question's SQL is gone with its buttons, so no click can file it under the
    new question."""
    base, feedback = local_site
    open_page(browser, base)
    ask(browser, PAIRS[0][0], COUNT_SQL)
    before = last_id(feedback)

    box = browser.find_element(By.ID, "question")
    box.clear()
    box.send_keys("How many singers do we have, counting every one of them twice?")
    browser.find_element(By.ID, "ask").click()
    wait_for(browser, lambda d: "413" in text(d, "status"), "the refusal")
    assert f"limit of {MAX_QUESTION_CHARS}" in text(browser, "status")
    assert_no_answer(browser)
    for button in ("right", "wrong"):
        browser.find_element(By.ID, button).click()  # disabled: nothing happens
    assert text(browser, "feedback-status") == ""  # no "saving…", so no request was made
    assert last_id(feedback) == before


def test_the_selected_databases_schema_is_shown(browser, site):
    """Beside the question, the tables of the selected database with their columns (primary
    keys underlined, foreign keys pointing to what they refer to): what a person writing a
    correction needs. Another database shows its own tables; pasted DDL shows none."""
    base, _ = site
    open_page(browser, base, KEY)

    def tables(d) -> dict[str, str]:
        items = d.find_elements(By.CSS_SELECTOR, "#schema li")
        return dict(li.text.split(": ", 1) for li in items)

    wait_for(browser, lambda d: "singer_in_concert" in tables(d), "concert_singer's tables")
    shown = tables(browser)
    assert list(shown) == ["stadium", "singer", "concert", "singer_in_concert"]
    assert shown["singer"].startswith("Singer_ID, Name, Country") and "Age" in shown["singer"]
    assert "Stadium_ID → stadium.Stadium_ID" in shown["concert"]
    keys = [u.text for u in browser.find_elements(By.CSS_SELECTOR, "#schema .pk")]
    assert "Singer_ID" in keys and "Name" not in keys
    assert text(browser, "schema-name") == DB and "4 tables" in text(browser, "schema-box")

    Select(browser.find_element(By.ID, "db")).select_by_value(OTHER_DB)
    wait_for(browser, lambda d: list(tables(d)) == ["Student", "Has_Pet", "Pets"], "pets_1's")
    assert "stadium" not in text(browser, "schema") and text(browser, "schema-name") == OTHER_DB

    browser.find_element(By.ID, "source-ddl").click()
    assert not browser.find_element(By.ID, "schema-box").is_displayed()
    browser.find_element(By.ID, "source-db").click()
    assert browser.find_element(By.ID, "schema-box").is_displayed()
    # the page fetches the schema again (asynchronously) when the database is picked again
    wait_for(browser, lambda d: list(tables(d)) == ["Student", "Has_Pet", "Pets"], "pets_1's again")


def test_the_saved_notice_clears_when_the_sql_is_edited(browser, site):
    """ "Saved" speaks of the SQL that was saved: once the SQL is edited (or another answer
    comes) the notice is gone rather than seeming to cover the new text."""
    base, _ = site
    open_page(browser, base, KEY)
    ask(browser, PAIRS[0][0], COUNT_SQL)
    browser.find_element(By.ID, "right").click()
    wait_for(browser, lambda d: 'saved your "right"' in text(d, "feedback-status"), "the note")
    browser.find_element(By.ID, "sql").send_keys(" WHERE Age > 30")
    assert text(browser, "feedback-status") == ""

    browser.find_element(By.ID, "save-correction").click()
    wait_for(browser, lambda d: "saved your correction" in text(d, "feedback-status"), "saved")
    ask(browser, PAIRS[3][0], NAME_SQL)
    assert text(browser, "feedback-status") == ""


def test_a_correction_that_does_not_run_is_refused_and_the_right_answer_stays(browser, local_site):
    """Mark an answer right, then save an edited SQL with a typo: the page shows the
    database's error instead of a thank-you, the edit stays in the box to fix, and the
    feedback file still holds the "right" verdict, nothing else. The fixed SQL then saves."""
    base, feedback = local_site
    open_page(browser, base)
    before = last_id(feedback)
    ask(browser, PAIRS[0][0], COUNT_SQL)
    browser.find_element(By.ID, "right").click()
    wait_for(browser, lambda d: 'saved your "right"' in text(d, "feedback-status"), "the note")

    typo = "SELECT Nme FROM singr"
    edit_sql(browser, typo)
    browser.find_element(By.ID, "save-correction").click()
    note = wait_for(
        browser,
        lambda d: "no such table: singr" in text(d, "feedback-status")
        and text(d, "feedback-status"),
        "the refusal",
    )
    assert "not stored" in note and "saved" not in note and "thank" not in note
    assert browser.find_element(By.ID, "feedback-status").get_attribute("class") == "error"
    assert value(browser, "sql") == typo
    columns = "db_id, question, predicted_sql, verdict, corrected_sql"
    assert feedback_since(feedback, before, columns) == [
        (DB, PAIRS[0][0], COUNT_SQL, "right", None)
    ]

    edit_sql(browser, "SELECT Name FROM singer")
    assert text(browser, "feedback-status") == ""
    browser.find_element(By.ID, "save-correction").click()
    wait_for(browser, lambda d: "saved your correction" in text(d, "feedback-status"), "saved")
    assert [r[3:] for r in feedback_since(feedback, before, columns)] == [
        ("right", None),
        ("wrong", "SELECT Name FROM singer"),
    ]


def test_without_an_api_key_feedback_from_the_page_is_stored_as_the_local_page(browser, local_site):
    """The default set-up (no key): the page's own session token lets its feedback in, and
    the record says it came from the local page (and from which model)."""
    base, feedback = local_site
    open_page(browser, base)
    before = last_id(feedback)
    ask(browser, PAIRS[3][0], NAME_SQL)
    edit_sql(browser, "SELECT Name, Capacity FROM stadium")
    browser.find_element(By.ID, "save-correction").click()
    wait_for(browser, lambda d: "saved your correction" in text(d, "feedback-status"), "saved")
    stored = feedback_since(feedback, before, "verdict, corrected_sql, writer, model")
    assert len(stored) == 1 and stored[0][:3] == (
        "wrong",
        "SELECT Name, Capacity FROM stadium",
        "local page",
    )
    assert stored[0][3]  # the served model's name


def test_a_page_from_before_a_server_restart_says_to_reload(browser, local_site):
    """A page whose session token the server no longer knows (it restarted since) gets its
    feedback refused, and the page says why and what to do: reload."""
    base, feedback = local_site
    open_page(browser, base)
    ask(browser, PAIRS[0][0], COUNT_SQL)
    before = last_id(feedback)
    browser.execute_script(  # what a restart does: the server draws a new secret
        'document.querySelector("meta[name=sqlrl-page-token]").content = "0.stale"'
    )
    browser.find_element(By.ID, "right").click()
    note = wait_for(
        browser,
        lambda d: "403" in text(d, "feedback-status") and text(d, "feedback-status"),
        "the refusal",
    )
    assert "reload the page" in note and "saved" not in note
    assert last_id(feedback) == before


def test_numbers_are_shown_as_a_person_writes_them(browser, site):
    """SQLite's floats come back with binary noise (avg(weight) of pets_1 is
    11.350000000000001); the rows show 11.35, while integers and text stay as they are."""
    base, _ = site
    open_page(browser, base, KEY)
    ask(browser, PAIRS[0][0], COUNT_SQL)
    edit_sql(browser, "SELECT 11.350000000000001, 0.1 + 0.2, 3, 'x', NULL")
    assert run_sql(browser)[1] == ["11.35", "0.3", "3", "x", "NULL"]
