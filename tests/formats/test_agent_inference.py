"""The reasoning and agent formats at inference (sqlrl/formats/, sqlrl/eval/evaluate.py): a
model is asked the way it was trained.

Real: Qwen2.5's tokenizer and chat template (offline), TRL's response parser, Spider's
databases, the execute_sql sandbox, the scorer. Scripted: the model's turns (a random model
writes no tool call), through the Generator protocol that both backends implement.
"""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest

from sqlrl.data.prompt_settings import AnswerFormat, PromptSettings, write_prompt_settings
from sqlrl.data.prompts import build_messages, compact_schema, render_prompt
from sqlrl.data.spider import database_path, load_schemas
from sqlrl.eval.evaluate import Split, evaluate_model
from sqlrl.formats import get_format
from sqlrl.formats.agent import AGENT_SYSTEM_PROMPT
from sqlrl.formats.reasoning import REASONING_SYSTEM_PROMPT
from sqlrl.formats.tool_loop import AgentLoop, render_agent_prompt, tool_schemas
from sqlrl.request_input import RequestInput
from tests.repo_tools import eval_params, fixed_params
from tests.scripted_turns import SINGERS, ScriptedGenerator, call

HEADS = "How many heads of the departments are older than 56 ?"


@pytest.fixture(scope="module")
def tokenizer():
    from sqlrl.model.qwen_tokenizer import build_qwen25_tokenizer

    return build_qwen25_tokenizer()


def agent_messages(spider_dir, db_id: str, question: str) -> list[dict]:
    schemas = load_schemas(spider_dir / "tables.json")
    prepared = build_messages(compact_schema(schemas[db_id]), question, "SQL only.")
    return get_format("agent").prompt(prepared)


def md5(path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


# --------------------------------------------------------------------------- prompts


def test_inference_prompts_are_the_training_prompts(spider_dir, tokenizer):
    """The server and TextToSQL (RequestInput with the model's recorded format) render the
    prompt training rendered: GRPO's rows (Format.rows) and SFT's trajectories
    (the format's sft_formatter) for the agent, with the tool's schema; GRPO's rows for reasoning."""
    from sqlrl.data.spider import load_examples
    from tests.repo_tools import grpo_rows

    schemas = load_schemas(spider_dir / "tables.json")
    example = next(
        e
        for e in load_examples(spider_dir / "train_spider.json", schemas)
        if e.db_id == "department_management"
    )
    grpo = grpo_rows(spider_dir, [example])
    settings = dict(schema_format="compact", sample_rows=0, system_prompt="SQL only.")

    reasoning = RequestInput(PromptSettings(**settings, rollout="reasoning"), spider_dir)
    asked = reasoning.messages(example.question, db_id="department_management")
    trained = get_format("reasoning").rows(grpo)[0]["prompt"]
    assert asked[0]["content"] == REASONING_SYSTEM_PROMPT
    assert render_prompt(tokenizer, asked) == render_prompt(tokenizer, trained)

    agent_params = fixed_params("grpo.rollout=agent", "base.tokenizer=qwen2.5").grpo
    sft = [{"prompt": grpo[0]["prompt"], "completion": [{"role": "assistant", "content": "x"}]}]
    get_format("agent").sft_formatter(agent_params).format_rows(sft, grpo)
    trained_sft = tokenizer.apply_chat_template(
        sft[0]["prompt"], tools=sft[0]["tools"], add_generation_prompt=True, tokenize=False
    )
    trained_grpo = render_agent_prompt(
        tokenizer, get_format("agent").rows(grpo)[0]["prompt"], tool_schemas()
    )
    agent = RequestInput(PromptSettings(**settings, rollout="agent"), spider_dir)
    asked = agent.messages(example.question, db_id="department_management")
    inference = render_agent_prompt(tokenizer, asked, tool_schemas())
    assert asked[0]["content"] == AGENT_SYSTEM_PROMPT
    assert inference == trained_sft == trained_grpo
    assert '"name": "execute_sql"' in inference and example.question in inference


# --------------------------------------------------------------------------- the loop


def test_a_probe_runs_on_its_own_database_and_its_observation_is_the_next_prompt(
    spider_dir, tokenizer
):
    """Two questions on two databases, one batched call per turn: each probe runs on its
    row's database (the other's table does not exist there), its observation is in that
    episode's next prompt, and the answer after it is the episode's final SQL."""
    probes = {SINGERS: "SELECT count(*) FROM singer", HEADS: "SELECT count(*) FROM head"}

    def script(prompt, turn):
        question = SINGERS if SINGERS in prompt else HEADS
        return call(probes[question]) if turn == 0 else f"```sql\n{probes[question]}\n```"

    generator = ScriptedGenerator(script)
    loop = AgentLoop(generator, tokenizer, AnswerFormat("agent", max_turns=3))
    episodes = loop.run(
        [
            agent_messages(spider_dir, "concert_singer", SINGERS),
            agent_messages(spider_dir, "department_management", HEADS),
        ],
        [
            str(database_path(spider_dir, "concert_singer")),
            str(database_path(spider_dir, "department_management")),
        ],
    )
    singers, heads = episodes[0][0], episodes[1][0]
    assert [len(batch) for batch in generator.batches] == [2, 2]
    assert singers.probes == [
        {"query": "SELECT count(*) FROM singer", "observation": "(1 row)\ncount(*)\n6"}
    ]
    assert heads.probes == [
        {"query": "SELECT count(*) FROM head", "observation": "(1 row)\ncount(*)\n10"}
    ]
    second = generator.batches[1]
    assert "<tool_response>\n(1 row)\ncount(*)\n6\n</tool_response>" in second[0]
    assert "<tool_response>\n(1 row)\ncount(*)\n10\n</tool_response>" in second[1]
    assert second[0].endswith("<|im_start|>assistant\n")
    assert singers.answer == "```sql\nSELECT count(*) FROM singer\n```"
    assert (singers.turns, singers.calls, singers.failed_calls) == (2, 1, 0)
    assert singers.trace("SELECT count(*) FROM singer")["final_sql"] == (
        "SELECT count(*) FROM singer"
    )


def test_an_episode_that_only_calls_the_tool_ends_without_an_answer(spider_dir, tokenizer):
    """max_turns rounds of calls, then a turn that still calls: no answer (as TRL's
    max_tool_calling_iterations); a question answered at once leaves the later batches."""

    def script(prompt, turn):
        if HEADS in prompt:
            return "SELECT count(*) FROM head WHERE age > 56"
        return call(f"SELECT name FROM singer LIMIT {turn + 1}")

    generator = ScriptedGenerator(script)
    loop = AgentLoop(generator, tokenizer, AnswerFormat("agent", max_turns=2))
    db = str(database_path(spider_dir, "concert_singer"))
    looping, direct = (
        group[0]
        for group in loop.run(
            [
                agent_messages(spider_dir, "concert_singer", SINGERS),
                agent_messages(spider_dir, "department_management", HEADS),
            ],
            [db, str(database_path(spider_dir, "department_management"))],
        )
    )
    assert [len(batch) for batch in generator.batches] == [2, 1, 1]
    assert looping.answer is None and looping.trace("")["final_sql"] == ""
    assert (looping.turns, looping.calls) == (3, 2)
    assert [p["query"] for p in looping.probes] == [
        "SELECT name FROM singer LIMIT 1",
        "SELECT name FROM singer LIMIT 2",
    ]
    assert direct.answer == "SELECT count(*) FROM head WHERE age > 56" and direct.calls == 0


def test_hostile_and_malformed_calls_are_failed_observations_and_the_database_is_untouched(
    spider_dir, tokenizer, tmp_path
):
    """A write is refused by the sandbox (an error observation, the file's md5 unchanged); a
    call of an unknown tool or with wrong arguments answers TRL's error text; all are counted
    as failed calls, and the episode goes on to its answer."""
    db = tmp_path / "concert_singer.sqlite"
    shutil.copy(database_path(spider_dir, "concert_singer"), db)
    before = md5(db)
    turns = [
        call("DROP TABLE singer"),
        call("INSERT INTO singer (Name) VALUES ('x')"),
        call("SELECT 1", name="drop_everything"),
        '<tool_call>\n{"name": "execute_sql", "arguments": {"sql": "SELECT 1"}}\n</tool_call>',
        "SELECT count(*) FROM singer",
    ]
    generator = ScriptedGenerator(lambda prompt, turn: turns[turn])
    loop = AgentLoop(generator, tokenizer, AnswerFormat("agent", max_turns=5))
    [[episode]] = loop.run([agent_messages(spider_dir, "concert_singer", SINGERS)], [str(db)])
    observations = [p["observation"] for p in episode.probes]
    assert observations[0].startswith("error:") and observations[1].startswith("error:")
    assert observations[2] == "{'error': 'Tool drop_everything not found.'}"
    assert observations[3].startswith("{'error': ")
    assert "unexpected keyword argument 'sql'" in observations[3]
    assert (episode.calls, episode.failed_calls) == (4, 4)
    assert episode.answer == "SELECT count(*) FROM singer"
    assert md5(db) == before


def test_sampled_episodes_draw_their_first_turns_together(spider_dir, tokenizer):
    """n > 1 at a temperature: a prompt's n episodes are its n first-turn samples, and each
    goes its own way after that."""

    def script(prompt, turn, i=0):
        if turn == 0:
            return call("SELECT count(*) FROM singer") if i == 0 else "SELECT 1"
        return "SELECT count(*) FROM singer"

    generator = ScriptedGenerator(script)
    loop = AgentLoop(generator, tokenizer, AnswerFormat("agent", max_turns=2))
    [group] = loop.run(
        [agent_messages(spider_dir, "concert_singer", SINGERS)],
        [str(database_path(spider_dir, "concert_singer"))],
        n=2,
        temperature=0.8,
    )
    assert [e.answer for e in group] == ["SELECT count(*) FROM singer", "SELECT 1"]
    assert [e.calls for e in group] == [1, 0]
    assert [len(batch) for batch in generator.batches] == [1, 1]


# --------------------------------------------------------------------------- evaluation


def model_folder(path, rollout: str, *overrides: str):
    """A model folder as sft writes it in `rollout`'s format (its sqlrl_prompt.json)."""
    from tests.repo_tools import save_tiny_qwen

    params = fixed_params(f"grpo.rollout={rollout}", "base.tokenizer=qwen2.5", *overrides)
    save_tiny_qwen(path)
    write_prompt_settings(path, params.prepare, False, params.grpo)
    return path


def test_an_agent_model_is_evaluated_with_the_tool_and_its_rows_carry_the_trace(
    singer_rows, spider_dir, tokenizer, tmp_path
):
    """Evaluation reads the agent format from the model folder: the tool loop runs on each
    question's database, the final answers are scored, the split's metrics count the tool
    calls, turns, failed calls and episodes without an answer, and each prediction row
    carries its probes and final SQL."""
    path, rows = singer_rows
    model = model_folder(tmp_path / "agent", "agent", "grpo.agent.max_turns=2")
    gold = [r["gold"] for r in rows]

    def script(prompt, turn):
        k = next(i for i, r in enumerate(rows) if r["question"] in prompt)
        if k == 0:  # probes once, then answers right
            return call("SELECT count(*) FROM singer") if turn == 0 else gold[0]
        if k == 1:  # a refused write, then a right answer
            return call("DELETE FROM singer") if turn == 0 else gold[1]
        if k == 2:  # never stops probing
            return call("SELECT 1")
        return "SELECT nope FROM singer"  # answers at once, wrong

    generator = ScriptedGenerator(script)
    metrics, predictions = evaluate_model(
        model,
        eval_params(),
        0,
        {"dev": Split(path, spider_dir / "tables.json", required=True)},
        generator=generator,
        render=lambda messages: pytest.fail("the agent renders its own prompts"),
        tokenizer=tokenizer,
        workers=1,
    )
    dev = metrics["dev"]
    assert dev["rollout"] == "agent" and dev["episodes"] == 4
    assert dev["ex"] == pytest.approx(0.5)
    assert dev["tool_calls_per_episode"] == pytest.approx((1 + 1 + 2 + 0) / 4)
    assert dev["turns_per_episode"] == pytest.approx((2 + 2 + 3 + 1) / 4)
    assert dev["failed_tool_call_share"] == pytest.approx(1 / 4)
    assert dev["no_answer_share"] == pytest.approx(1 / 4)
    rows_out = predictions["dev"]
    assert [p["ex"] for p in rows_out] == [1, 1, 0, 0]
    assert rows_out[0]["trace"] == {
        "probes": [{"query": "SELECT count(*) FROM singer", "observation": "(1 row)\ncount(*)\n6"}],
        "final_sql": rows_out[0]["pred"],
    }
    assert rows_out[1]["trace"]["probes"][0]["observation"].startswith("error:")
    assert rows_out[2]["pred"] == "" and rows_out[2]["trace"]["final_sql"] == ""
    assert len(rows_out[2]["trace"]["probes"]) == 2
    assert generator.batches[0][0].startswith(
        "<|im_start|>system\n" + AGENT_SYSTEM_PROMPT + "\n\n# Tools"
    )


def test_a_reasoning_model_is_scored_on_its_final_answer_only(singer_rows, spider_dir, tmp_path):
    """A reasoning model gets the reasoning system prompt; only a final <answer> is scored
    (a query outside the tags is no answer), and the split reports the format reward's mean
    and the share without an answer. No trace: there is no tool."""
    path, rows = singer_rows
    model = tmp_path / "reasoning"
    model.mkdir()
    params = fixed_params("grpo.rollout=reasoning")
    write_prompt_settings(model, params.prepare, False, params.grpo)
    gold = [r["gold"] for r in rows]
    outputs = {
        rows[0]["question"]: f"<think>count them</think>\n<answer>{gold[0]}</answer>",
        rows[1][
            "question"
        ]: f"<think>draft:\n```sql\nSELECT 1\n```</think><answer>{gold[1]}</answer>",
        rows[2]["question"]: f"<think>easy</think>\n```sql\n{gold[2]}\n```",  # no answer tag
        rows[3]["question"]: f"<answer>{gold[3]}</answer>",  # no thinking: scored, shape 0
    }
    seen = []

    def render(messages):
        seen.append(messages)
        return messages[-1]["content"]

    class Fixed:
        def generate(self, prompts):
            return [next(v for q, v in outputs.items() if q in p) for p in prompts]

    metrics, predictions = evaluate_model(
        model,
        eval_params(),
        0,
        {"dev": Split(path, spider_dir / "tables.json", required=True)},
        generator=Fixed(),
        render=render,
        workers=1,
    )
    assert all(m[0]["content"] == REASONING_SYSTEM_PROMPT for m in seen)
    dev = metrics["dev"]
    assert [p["ex"] for p in predictions["dev"]] == [1, 1, 0, 1]
    assert predictions["dev"][2]["pred"] == ""
    assert dev["rollout"] == "reasoning" and dev["no_answer_share"] == pytest.approx(0.25)
    assert dev["mean_format_reward"] == pytest.approx(0.5)
    assert "trace" not in predictions["dev"][0]


def test_the_real_generator_runs_the_agent_loop_end_to_end(singer_rows, spider_dir, tmp_path):
    """No generator given: evaluation loads the agent model folder (a tiny random Qwen2 on
    Qwen2.5's tokenizer) with transformers and runs the loop; a random model writes no call,
    so every episode is one turn, and the split still has the agent's metrics."""
    path, _ = singer_rows
    model = model_folder(tmp_path / "agent_real", "agent")
    metrics, predictions = evaluate_model(
        model,
        eval_params(max_new_tokens=4),
        0,
        {"dev": Split(path, spider_dir / "tables.json", required=True)},
        workers=1,
        progress=False,
    )
    dev = metrics["dev"]
    assert dev["rollout"] == "agent" and dev["episodes"] == 4 and dev["n"] == 4
    assert dev["turns_per_episode"] >= 1.0
    assert all("trace" in p for p in predictions["dev"])


def test_an_unknown_format_in_the_model_folder_stops_evaluation_naming_it(
    singer_rows, spider_dir, tmp_path
):
    from sqlrl.data.prompt_settings import PROMPT_SETTINGS_FILE, PromptSettingsError

    path, _ = singer_rows
    (tmp_path / PROMPT_SETTINGS_FILE).write_text(json.dumps({"rollout": "tree_search"}))
    with pytest.raises(PromptSettingsError, match="tree_search"):
        evaluate_model(
            tmp_path,
            eval_params(),
            0,
            {"dev": Split(path, spider_dir / "tables.json", required=True)},
            generator=ScriptedGenerator(lambda p, t: ""),
            render=str,
        )


def test_the_python_api_asks_an_agent_model_with_the_tool_and_returns_its_trace(
    spider_dir, tmp_path
):
    """TextToSQL reads the agent format from the model folder, runs the loop on `db` and
    returns the trace on the Answer; its SQL is the one executed."""
    from sqlrl.text_to_sql import TextToSQL

    model = model_folder(tmp_path / "agent_api", "agent")
    t2s = TextToSQL(model, spider_dir=spider_dir, max_new_tokens=8)
    assert t2s.format.calls_tools and t2s.settings.rollout == "agent"
    count = "SELECT count(*) FROM singer"
    t2s.generator = ScriptedGenerator(lambda prompt, turn: call(count) if turn == 0 else count)
    answer = t2s.answer(SINGERS, db="concert_singer", execute=True)
    assert answer.sql == count and list(answer.verdict.rows) == [(6,)]
    assert answer.trace == {
        "probes": [{"query": count, "observation": "(1 row)\ncount(*)\n6"}],
        "final_sql": count,
    }
    assert t2s(SINGERS, db="concert_singer") == count


def test_an_agent_models_majority_vote_runs_sampled_episodes(
    singer_rows, spider_dir, tokenizer, tmp_path
):
    """maj@k for an agent model: k sampled episodes a question, their final answers voted on
    by result; an episode out of turns has no vote. Greedy is scored next to it."""
    path, rows = singer_rows
    params = fixed_params("grpo.rollout=agent", "base.tokenizer=qwen2.5", "grpo.agent.max_turns=1")
    write_prompt_settings(tmp_path, params.prepare, False, params.grpo)
    gold = {r["question"]: r["gold"] for r in rows}

    def script(prompt, turn, i=0):
        question = next(q for q in gold if q in prompt)
        if i == 2 or turn > 0:  # the third sample only probes: no answer, no vote
            return call("SELECT 1")
        return gold[question] if i == 0 else "SELECT 0"  # greedy and sample 0: right

    generator = ScriptedGenerator(script)
    metrics, predictions = evaluate_model(
        tmp_path,
        eval_params(num_samples=3, temperature=0.7),
        0,
        {"dev": Split(path, spider_dir / "tables.json", required=True)},
        vote=True,
        generator=generator,
        render=str,
        tokenizer=tokenizer,
        workers=1,
    )
    dev = metrics["dev"]
    assert dev["ex"] == 1.0 and dev["maj"]["k"] == 3 and dev["maj"]["ex"] == 1.0
    # samples 0 and 1 disagree (one vote each: the first wins), sample 2 has no answer
    assert [p["votes"] for p in predictions["dev"]] == [1] * 4
    assert [p["maj_ex"] for p in predictions["dev"]] == [1] * 4
    # greedy's one turn; the first turn's 3 samples of 4 prompts; the 4 probers' last turn
    assert [len(batch) for batch in generator.batches] == [4, 4, 4]
