"""The rollout formats (grpo.rollout, sqlrl/formats/): prompts, the strict answer extractors,
the format reward."""

from __future__ import annotations

import pytest

from sqlrl.formats import get_format
from sqlrl.formats.agent import AGENT_SYSTEM_PROMPT, final_answer_sql
from sqlrl.formats.reasoning import REASONING_SYSTEM_PROMPT, answer_sql
from sqlrl.train.rewards import format_reward, make_rewards

ROW = {
    "prompt": [{"role": "system", "content": "SQL only."}, {"role": "user", "content": "Q"}],
    "gold_sql": "SELECT 1",
}


def test_the_sql_rollout_leaves_the_rows_as_prepare_wrote_them():
    rows = [ROW]
    assert get_format("sql").rows(rows) is rows


@pytest.mark.parametrize(
    ("rollout", "system"), [("reasoning", REASONING_SYSTEM_PROMPT), ("agent", AGENT_SYSTEM_PROMPT)]
)
def test_other_rollouts_replace_only_the_system_prompt(rollout, system):
    (row,) = get_format(rollout).rows([ROW])
    assert row["prompt"] == [{"role": "system", "content": system}, ROW["prompt"][1]]
    assert row["gold_sql"] == ROW["gold_sql"] and ROW["prompt"][0]["content"] == "SQL only."


@pytest.mark.parametrize(
    ("completion", "sql"),
    [
        (
            "<think>count them</think>\n<answer>SELECT count(*) FROM t</answer>",
            "SELECT count(*) FROM t",
        ),
        ("<think>x</think><answer>\n```sql\nSELECT a FROM t;\n```\n</answer>\n", "SELECT a FROM t"),
        ("<think>draft:\n```sql\nSELECT b FROM t\n```</think>", ""),  # a draft, no answer
        ("SELECT a FROM t", ""),  # no tags: no answer
        ("<think>x</think><answer>SELECT a FROM t</answer> and then more", ""),  # not at the end
        ("<answer>SELECT a FROM t</answer><answer>SELECT b FROM t</answer>", "SELECT b FROM t"),
        ("<think>x</think><answer>SELECT a FROM t", ""),  # cut before the tag closed
        ([{"role": "assistant", "content": "<answer>SELECT 2</answer>"}], "SELECT 2"),
    ],
)
def test_the_reasoning_extractor_takes_only_the_final_answer(completion, sql):
    assert answer_sql(completion) == sql


def test_the_format_reward_pays_for_the_reasoning_shape_only():
    assert format_reward(
        [
            "<think>the singers over 40</think>\n<answer>SELECT name FROM singer</answer>",
            "  <think>a</think><answer>b</answer>\n",
            "<answer>SELECT 1</answer>",  # no reasoning
            "<think>a</think>",  # no answer
            "<think>a</think><answer>b</answer> trailing",
            "<think></think><answer>b</answer>",  # empty reasoning
            "<think>a<think>b</think><answer>c</answer>",  # nested tags
            "SELECT 1",
        ]
    ) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_the_agents_sql_is_its_final_answer_after_the_tool_calls():
    call = {"type": "function", "function": {"name": "execute_sql", "arguments": {"query": "X"}}}
    episode = [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "execute_sql", "content": "(1 row)\nn\n6"},
        {"role": "assistant", "content": "```sql\nSELECT count(*) FROM singer\n```"},
    ]
    assert final_answer_sql(episode) == "SELECT count(*) FROM singer"
    assert final_answer_sql(episode[:2]) == ""  # ended on the tool's result: no answer
    assert final_answer_sql(episode[:1]) == ""  # ended on a call (out of turns or tokens)
    assert final_answer_sql("SELECT 1") == "SELECT 1"  # no tool loop ran


def test_rewards_read_the_sql_the_rollouts_extractor_finds(spider_dir):
    db = str(spider_dir / "database" / "concert_singer" / "concert_singer.sqlite")
    gold = "SELECT count(*) FROM singer"
    execution, _ = make_rewards(workers=1, extract=answer_sql)
    completions = [
        f"<think>count</think><answer>{gold}</answer>",
        f"<think>maybe {gold}</think>",  # the right SQL, never answered
    ]
    assert execution(completions, db_path=[db] * 2, gold_sql=[gold] * 2) == [1.0, 0.0]
    assert execution.stats["without_sql"] == 1
