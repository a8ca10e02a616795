"""The GRPO execution reward: right answers score 1, anything else 0, absent databases None."""

from __future__ import annotations

from pathlib import Path

import pytest

from sqlrl.sql.executor import ExecLimits
from sqlrl.train.rewards import execution_reward, make_execution_reward, make_rewards, syntax_reward
from tests.repo_tools import REPO_ROOT

GOLD = "SELECT name FROM singer WHERE age > 40"
SLOW = (
    "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r WHERE i < {n}) "
    "SELECT count(*) FROM r"
)


@pytest.fixture(scope="module")
def relative_db(spider_dir) -> str:
    """concert_singer as the dataset column holds it: relative to the repo root."""
    path = spider_dir / "database" / "concert_singer" / "concert_singer.sqlite"
    return path.relative_to(REPO_ROOT).as_posix()


@pytest.fixture(scope="module")
def rewards():
    """Inline (workers=1) reward functions with a short time limit."""
    execution, syntax = make_rewards(ExecLimits(timeout_s=0.5), workers=1)
    yield execution, syntax
    execution.pool.close()


def test_names_are_what_trl_logs():
    assert execution_reward.__name__ == "execution_reward"
    assert syntax_reward.__name__ == "syntax_reward"
    assert make_execution_reward(workers=1).__name__ == "execution_reward"


def test_right_results_score_one_and_wrong_ones_zero(rewards, relative_db):
    execution, _ = rewards
    completions = [
        "```sql\nSELECT name FROM singer WHERE age > 40;\n```",
        "SELECT name FROM singer WHERE age >= 41",  # other SQL, same rows
        "SQL: SELECT name FROM singer WHERE age > 30",  # more rows
        [{"role": "assistant", "content": "SELECT Name FROM singer WHERE 40 < age"}],
        "SELECT name, age FROM singer WHERE age > 40",  # extra column
        "I cannot answer that.",
    ]
    scores = execution(completions, db_path=[relative_db] * 6, gold_sql=[GOLD] * 6)
    assert scores == [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]


def test_an_absent_database_is_not_scored(rewards, spider_dir, tmp_path):
    execution, syntax = rewards
    absent = str(spider_dir / "database" / "wta_1" / "wta_1.sqlite")
    completions = ["SELECT count(*) FROM players"] * 2
    assert execution(completions, db_path=[absent] * 2, gold_sql=[GOLD] * 2) == [None, None]
    assert syntax(completions, db_path=[absent] * 2, gold_sql=[GOLD] * 2) == [None, None]
    assert execution.stats["skipped"] >= 2
    assert not Path(absent).exists()


BAD_COMPLETIONS = [
    "",
    "   ",
    "garbage ~~ !!",
    "The answer is 42.",
    "DELETE FROM singer",
    "UPDATE singer SET age = 0",
    "DROP TABLE singer",
    "SELECT 1; DROP TABLE singer",
    "SELECT name FROM singer WHERE age > 40; DELETE FROM singer",
    "ATTACH 'evil.db' AS evil",
    "PRAGMA query_only = 0",
    "PRAGMA writable_schema = 1",
    "VACUUM INTO 'copy.db'",
    "SELECT load_extension('evil')",
    "SELECT name\x00 FROM singer",
    "SELECT " + "1 + " * 300_000 + "1",
    "SELECT " + "(" * 3_000 + "1" + ")" * 3_000,
    SLOW.format(n="1e18"),
    "SELECT zeroblob(2e9)",
    "```sql\nCREATE TABLE t (x int)\n```",
]


def test_bad_completions_score_zero_and_change_nothing(rewards, private_db, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    execution, _ = rewards
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*") if p.is_file()}
    n = len(BAD_COMPLETIONS)
    logged = {}
    scores = execution(
        BAD_COMPLETIONS,
        db_path=[str(private_db)] * n,
        gold_sql=[GOLD] * n,
        log_metric=logged.__setitem__,
    )
    assert scores == [0.0] * n
    # only the endless query waits for the time limit; everything else is refused at once
    assert logged["execution/timeout_frac"] == 1 / n
    assert logged["execution/error_frac"] == (n - 1) / n
    after = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in tmp_path.rglob("*") if p.is_file()}
    assert after == before


def test_a_prediction_that_streams_forever_is_read_only_past_the_gold_rows(relative_db):
    """More rows than the gold result already decide the verdict: the prediction is a wrong
    answer, not a timeout (30 s here) nor an error at the 100,000-row cap."""
    execution = make_execution_reward(ExecLimits(timeout_s=30.0), workers=1)
    endless = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT i FROM r"
    logged = {}
    scores = execution(
        [endless], db_path=[relative_db], gold_sql=[GOLD], log_metric=logged.__setitem__
    )
    assert scores == [0.0]
    assert (logged["execution/timeout_frac"], logged["execution/error_frac"]) == (0.0, 0.0)


def test_the_syntax_reward_pays_for_sql_that_executes(rewards, relative_db):
    _, syntax = rewards
    completions = [GOLD, "SELECT count(*) FROM singer", "SELEC name", "DROP TABLE singer", ""]
    assert syntax(completions, db_path=[relative_db] * 5, gold_sql=[GOLD] * 5) == [
        1.0,
        1.0,
        0.0,
        0.0,
        0.0,
    ]
    assert syntax(completions[:2], db_path=[relative_db] * 2) == [1.0, 1.0]  # no gold needed


@pytest.mark.parametrize(
    "call",
    [
        lambda f, db: f(["SELECT 1"] * 3, db_path=[db] * 2, gold_sql=[GOLD] * 3),
        lambda f, db: f([None, 3, {"content": None}], db_path=[db] * 3, gold_sql=[GOLD] * 3),
        lambda f, db: f(["SELECT 1"], db_path=[None], gold_sql=[None]),
        lambda f, db: f(["SELECT 1"], db_path=[["not", "a", "path"]], gold_sql=[GOLD]),
    ],
)
def test_unusable_batches_never_raise(rewards, relative_db, call):
    execution, syntax = rewards
    for fn in (execution, syntax):
        scores = call(fn, relative_db)
        assert all(s == 0.0 for s in scores)
    assert execution(None, db_path=None, gold_sql=None) == []


def test_trl_keyword_arguments_are_accepted_and_metrics_logged(rewards, relative_db):
    execution, _ = rewards
    logged = {}
    scores = execution(
        prompts=["q"] * 2,
        completions=[GOLD, "SELEC"],
        completion_ids=[[1], [2]],
        db_path=[relative_db] * 2,
        gold_sql=[GOLD] * 2,
        trainer_state=None,
        log_extra=lambda *a: None,
        log_metric=logged.__setitem__,
    )
    assert scores == [1.0, 0.0]
    assert logged["execution/error_frac"] == 0.5 and logged["execution/timeout_frac"] == 0.0


def test_identical_items_in_a_batch_are_judged_once(relative_db, monkeypatch):
    """A GRPO group repeats completions: each distinct (database, gold, SQL) runs once, and
    one already judged in an earlier batch is not run again."""
    from sqlrl.sql.judge import Judge

    judged = []
    real = Judge.judge
    monkeypatch.setattr(
        Judge, "judge", lambda self, *item: judged.append(item) or real(self, *item)
    )
    execution = make_execution_reward(ExecLimits(timeout_s=5.0), workers=1)
    same = "SELECT name FROM singer WHERE age >= 41"  # other SQL, the gold rows
    other = "SELECT name FROM singer"
    scores = execution([same] * 40 + [other], db_path=[relative_db] * 41, gold_sql=[GOLD] * 41)
    assert scores == [1.0] * 40 + [0.0]
    assert sorted(sql for _, _, sql in judged) == sorted([same, other])
    assert execution([other, same], db_path=[relative_db] * 2, gold_sql=[GOLD] * 2) == [0.0, 1.0]
    assert len(judged) == 2


@pytest.mark.parametrize("backend", ["process", "thread"])
def test_parallel_scoring_agrees_with_inline_scoring(relative_db, spider_dir, backend):
    world = (spider_dir / "database" / "world_1" / "world_1.sqlite").relative_to(REPO_ROOT)
    batch = []
    for i in range(40):
        batch.append((f"SELECT name FROM singer WHERE age > {i}", relative_db, GOLD))
        batch.append(
            (
                f"SELECT count(*) FROM country WHERE population > {i * 1000}",
                str(world),
                "SELECT count(*) FROM country WHERE population > 5000",
            )
        )
    batch.append((SLOW.format(n="1e18"), relative_db, GOLD))
    completions, paths, golds = map(list, zip(*batch, strict=False))
    inline = make_execution_reward(ExecLimits(timeout_s=0.5), workers=1)
    parallel = make_execution_reward(ExecLimits(timeout_s=0.5), workers=2, backend=backend)
    try:
        expected = inline(completions, db_path=paths, gold_sql=golds)
        assert 0 < expected.count(1.0) < len(expected) - 1 and expected[-1] == 0.0
        assert parallel(completions, db_path=paths, gold_sql=golds) == expected
        assert parallel(completions, db_path=paths, gold_sql=golds) == expected  # warm pool
    finally:
        parallel.pool.close()


def test_a_failing_worker_pool_does_not_fail_the_batch(relative_db, monkeypatch):
    import sqlrl.sql.judge

    def broken_worker(chunk):
        raise RuntimeError("worker died")

    monkeypatch.setattr(sqlrl.sql.judge, "_judge_chunk", broken_worker)
    execution = make_execution_reward(workers=2, backend="thread")
    completions = [f"SELECT name FROM singer WHERE age > {i}" for i in range(35, 75)]
    scores = execution(completions, db_path=relative_db, gold_sql=GOLD)
    assert scores == [1.0 if 32 <= i < 41 else 0.0 for i in range(35, 75)]


def test_with_schema_repair_the_repaired_sql_is_rewarded(spider_dir, relative_db, caplog):
    """grpo.schema_repair: a memorised table name is judged after mapping onto the schema."""
    from sqlrl.data.spider import load_schemas

    execution, syntax = make_rewards(
        ExecLimits(timeout_s=0.5), workers=1, schemas=load_schemas(spider_dir / "tables.json")
    )
    plain, _ = make_rewards(ExecLimits(timeout_s=0.5), workers=1)
    completions = [
        "SELECT count(*) FROM performance",
        "SELECT count(*) FROM singer",
        "SELECT count(*) FROM stadium",
    ]
    columns = dict(
        db_path=[relative_db] * 3,
        gold_sql=["SELECT count(*) FROM singer"] * 3,
        db_id=["concert_singer"] * 3,
        question=["How many singers do we have?"] * 3,
    )
    try:
        assert execution(completions, **columns) == [1.0, 1.0, 0.0]
        assert plain(completions, **columns) == [0.0, 1.0, 0.0]
        assert syntax(completions, **columns) == [1.0, 1.0, 1.0]
        # a dataset without the question column cannot be repaired: an error, not a guess
        no_question = {k: v for k, v in columns.items() if k != "question"}
        assert execution(completions, **no_question) == [0.0, 0.0, 0.0]
        assert "needs the db_id and question columns" in caplog.text
    finally:
        execution.pool.close()
        plain.pool.close()


def test_executable_credit_rewards_sql_that_runs_but_is_wrong(relative_db):
    """grpo.executable_credit (Arctic-Text2SQL-R1: 0.1): right 1.0, runs 0.1, fails 0.0."""
    execution, _ = make_rewards(ExecLimits(timeout_s=0.5), workers=1, executable_credit=0.1)
    try:
        scores = execution(
            [GOLD, "SELECT name FROM singer", "SELECT nope FROM singer"],
            db_path=[relative_db] * 3,
            gold_sql=[GOLD] * 3,
        )
    finally:
        execution.pool.close()
    assert scores == [1.0, 0.1, 0.0]


def test_one_odd_completion_does_not_zero_the_batch(rewards, relative_db):
    """A NUL or lone surrogate in one completion scored the whole batch 0.0."""
    execution, syntax = rewards
    completions = [
        GOLD,
        "SELECT 1\x00;",
        "SELECT name FROM singer WHERE age > 40; \ud800 prose",
        "```sql\nSELECT 1\x00; DROP TABLE singer\n```",
        GOLD + ";",
    ]
    n = len(completions)
    assert execution(completions, db_path=[relative_db] * n, gold_sql=[GOLD] * n) == [
        1.0,
        0.0,
        1.0,
        0.0,
        1.0,
    ]
    assert syntax(completions, db_path=[relative_db] * n, gold_sql=[GOLD] * n) == [
        1.0,
        0.0,
        1.0,
        0.0,
        1.0,
    ]


def test_a_failing_extraction_scores_only_its_completion_zero(rewards, relative_db, monkeypatch):
    import sqlrl.train.rewards as rewards_module

    real = rewards_module.extract_sql
    monkeypatch.setattr(rewards_module, "extract_sql", lambda c: real(c) if c != "boom" else 1 / 0)
    execution, _ = rewards
    assert execution([GOLD, "boom", GOLD], db_path=[relative_db] * 3, gold_sql=[GOLD] * 3) == [
        1.0,
        0.0,
        1.0,
    ]


def test_the_registry_names_each_reward_and_params_order_them(spider_dir):
    """grpo.reward_weights maps names to weights; TRL gets the functions and the weights in its
    order, and the defaults mean what they meant before names (execution 1, syntax 0)."""
    from sqlrl.reward_names import REWARDS
    from sqlrl.train.rewards import reward_functions, reward_registry, reward_weight_list
    from tests.repo_tools import fixed_params

    grpo = fixed_params().grpo
    registry = reward_registry(grpo, spider_dir)
    assert list(registry) == list(REWARDS)  # every name built, in the registry's order
    assert {n: f.__name__ for n, f in registry.items()} == {  # the names TRL logs
        "execution": "execution_reward",
        "syntax": "syntax_reward",
        "format": "format_reward",
    }
    assert [f.__name__ for f in reward_functions(grpo, spider_dir)] == [
        "execution_reward",
        "syntax_reward",
    ]
    assert reward_weight_list(grpo) == [1.0, 0.0]
    grpo = fixed_params("+grpo.reward_weights.format=0.25").grpo
    assert [f.__name__ for f in reward_functions(grpo, spider_dir)][-1] == "format_reward"
    assert reward_weight_list(grpo) == [1.0, 0.0, 0.25]


def test_an_unknown_reward_name_is_refused_when_params_load():
    from sqlrl.params import ParamsError
    from tests.repo_tools import fixed_params

    with pytest.raises(ParamsError, match="unknown reward 'exec'"):
        fixed_params("+grpo.reward_weights.exec=1.0")


def test_a_users_reward_is_imported_by_its_dotted_path(tmp_path, monkeypatch, relative_db):
    from sqlrl.train.rewards import RewardError, resolve_reward

    (tmp_path / "my_rewards.py").write_text(
        "def short(completions, **kwargs):\n"
        "    return [1.0 if len(c) < 30 else 0.0 for c in completions]\n"
        "NOT_A_FUNCTION = 3\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    short = resolve_reward("my_rewards:short")
    assert short(["SELECT 1", "x" * 40], db_path=[relative_db] * 2) == [1.0, 0.0]
    for name, message in [
        ("my_rewards:absent", r"cannot import reward 'my_rewards:absent': AttributeError"),
        ("no_such_module:f", r"cannot import reward 'no_such_module:f': ModuleNotFoundError"),
        ("my_rewards:NOT_A_FUNCTION", r"'my_rewards:NOT_A_FUNCTION' is a int, not a function"),
        ("my_rewards", r"unknown reward 'my_rewards'"),
    ]:
        with pytest.raises(RewardError, match=message) as caught:
            resolve_reward(name)
        assert "\n" not in str(caught.value)


def test_importing_the_rewards_builds_nothing():
    """No judge pool is made when sqlrl.train.rewards is imported (every training stage does),
    and sqlrl.params reads the reward names without importing it: the registry's builders run
    when a run's rewards, or the module-level defaults, are first asked for."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import sqlrl.params\n"
        "assert 'sqlrl.train.rewards' not in sys.modules and 'sqlrl.sql.judge' not in sys.modules\n"
        "from sqlrl.sql import judge\n"
        "built = []\n"
        "real = judge.JudgePool.__init__\n"
        "judge.JudgePool.__init__ = lambda self, *a, **k: built.append(1) or real(self, *a, **k)\n"
        "from sqlrl.train import rewards\n"
        "print(len(built), end=' ')\n"
        "rewards.execution_reward, rewards.syntax_reward, rewards.resolve_reward('format')\n"
        "print(len(built))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["0", "1"]  # the defaults: built once, on first use


def test_importing_and_building_the_rewards_starts_no_worker_process(spider_dir):
    """The module-level rewards and a configured registry start their judge's workers only
    with the first batch: importing them (every stage does) costs no processes."""
    import subprocess
    import sys

    code = (
        "import multiprocessing\n"
        "from sqlrl.train import rewards\n"
        "from tests.repo_tools import fixed_params\n"
        f"registry = rewards.reward_registry(fixed_params().grpo, {str(spider_dir)!r})\n"
        "pools = [rewards.execution_reward.pool, registry['execution'].pool]\n"
        "print(len(multiprocessing.active_children()), [p._pool for p in pools])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["0", "[None,", "None]"]


def test_the_pass_rate_filter_asks_for_the_execution_reward_by_name(
    spider_dir, tmp_path, monkeypatch, relative_db
):
    """With syntax listed before execution, the grpo_prompts stage still measures pass rates
    with the execution reward: a query that runs but is wrong does not pass."""
    import argparse

    import stages.grpo_prompts as stage
    from sqlrl.jsonio import write_jsonl
    from tests.repo_tools import write_fixed_params

    used = []

    def fake_rates(rows, generator, tokenizer, samples, temperature, seed, reward_fn):
        wrong = "SELECT name FROM singer"  # runs: syntax 1.0, execution 0.0
        used.append(
            reward_fn(
                ["```sql\n" + GOLD + "\n```", wrong],
                **{
                    "db_path": [relative_db] * 2,
                    "gold_sql": [GOLD] * 2,
                    "db_id": ["concert_singer"] * 2,
                    "question": ["q"] * 2,
                },
            )
        )
        return [0.5] * len(rows)

    monkeypatch.setattr(stage, "pass_rate_generator", lambda *a: (None, None))
    monkeypatch.setattr(stage, "sampled_pass_rates", fake_rates)
    params = write_fixed_params(
        tmp_path / "params.yaml",
        "~grpo.reward_weights.execution",
        "+grpo.reward_weights.execution=1.0",  # now after syntax
        "grpo.pass_rate_filter.pool=1",
        "grpo.drop_empty_gold=false",
    )
    row = {
        "prompt": [{"role": "user", "content": "q"}],
        "gold_sql": GOLD,
        "db_id": "concert_singer",
        "question": "q",
        "db_path": relative_db,
    }
    write_jsonl(tmp_path / "grpo.jsonl", [row])
    args = argparse.Namespace(
        params=str(params),
        model="unused",
        prompts=str(tmp_path / "grpo.jsonl"),
        spider=str(spider_dir),
        out=str(tmp_path / "out.jsonl"),
        metrics=str(tmp_path / "m.json"),
    )
    assert stage.main(args) == 0
    assert used == [[1.0, 0.0]]
