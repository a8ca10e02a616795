"""Self-consistency with schema repair (eval.num_samples > 1 and eval.schema_repair), on real
Spider databases: a candidate that names a table the database lacks is repaired before it
runs, so it votes with the candidates that return the same result."""

from __future__ import annotations

import pytest

from sqlrl.data.rows import recorded_path
from sqlrl.data.spider import database_path, load_schemas
from sqlrl.eval.evaluate import evaluate_split
from sqlrl.eval.voting import self_consistency
from sqlrl.sql.schema_repair import repairer

# (db_id, question, gold, sampled texts): the wrong answer is the largest group as written;
# the memorised or misspelt table names are repaired onto the right one
QUESTIONS = [
    (
        "concert_singer",
        "How many singers do we have?",
        "SELECT count(*) FROM singer",
        [
            "SELECT count(*) FROM stadium",  # 9: runs, but the wrong table
            "SELECT count(*) FROM stadium",
            "```sql\nSELECT count(*) FROM performance\n```",  # another database's table
            "SELECT count(*) FROM singer",  # 6
            "SELECT count(*) FROM singers",
        ],
    ),
    (
        "pets_1",
        "How many pets are there?",
        "SELECT count(*) FROM pets",
        [
            "SELECT count(*) FROM student",  # 34
            "SELECT count(*) FROM singer",  # concert_singer's table: repaired only for pets_1
            "SELECT count(*) FROM animals",
        ],
    ),
]


@pytest.fixture(scope="module")
def schemas(spider_dir):
    return load_schemas(spider_dir / "tables.json")


@pytest.fixture(scope="module")
def db_paths(spider_dir):
    return [recorded_path(database_path(spider_dir, db_id)) for db_id, *_ in QUESTIONS]


def test_a_repaired_candidate_joins_the_majority(schemas, db_paths):
    samples = [texts for *_, texts in QUESTIONS]
    fix = repairer(schemas, [q[0] for q in QUESTIONS], [q[1] for q in QUESTIONS])

    chosen, votes, _ = self_consistency(samples, db_paths)
    assert (chosen, votes) == (
        ["SELECT count(*) FROM stadium", "SELECT count(*) FROM student"],
        [2, 1],
    )

    chosen, votes, texts = self_consistency(samples, db_paths, fix=fix)
    # each question's candidates are repaired against its own database (pets_1 has no singer)
    assert chosen == ["SELECT COUNT(*) FROM singer", "SELECT COUNT(*) FROM Pets"]
    assert votes == [3, 2]
    assert texts == [samples[0][2], samples[1][1]]  # the model's own text of the chosen one


def test_evaluation_scores_the_repaired_majority_and_keeps_the_models_sql(spider_dir, db_paths):
    rows = [
        {
            "question": question,
            "db_id": db_id,
            "gold": gold,
            "db_present": True,
            "db_path": path,
            "prompt": [{"role": "user", "content": question}],
        }
        for (db_id, question, gold, _), path in zip(QUESTIONS, db_paths, strict=True)
    ]
    sampled = {question: texts for _, question, _, texts in QUESTIONS}

    class Sampler:
        def generate(self, prompts):  # greedy: each question's first text
            return [sampled[p][0] for p in prompts]

        def sample(self, prompts, n, temperature, seed):
            return [sampled[p][:n] for p in prompts]

    def evaluate(schema_repair: bool):
        return evaluate_split(
            rows,
            Sampler(),
            lambda messages: messages[-1]["content"],
            tables_json=spider_dir / "tables.json",
            vote_samples=5,
            temperature=0.7,
            schema_repair=schema_repair,
            workers=1,
        )

    plain, _ = evaluate(schema_repair=False)
    assert plain["ex"] == 0.0 and plain["maj"]["ex"] == 0.0
    metrics, preds = evaluate(schema_repair=True)
    # greedy answered the wrong (existing) tables: nothing to repair, nothing right
    assert metrics["ex"] == 0.0 and metrics["repaired"] == 0
    assert metrics["maj"]["k"] == 5 and metrics["maj"]["ex"] == 1.0
    assert [p["maj_ex"] for p in preds] == [1, 1]
    assert [p["votes"] for p in preds] == [3, 2]
    assert [p["maj_pred"] for p in preds] == [
        "SELECT COUNT(*) FROM singer",
        "SELECT COUNT(*) FROM Pets",
    ]
    assert [p["pred"] for p in preds] == [
        "SELECT count(*) FROM stadium",
        "SELECT count(*) FROM student",
    ]
