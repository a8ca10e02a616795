"""Evaluation with `eval.constrained` (issue 46): a real tiny model, real Spider dev questions
on five databases, each decoded under its own database's grammar.

The model (tests/serve_helpers.py) is trained on concert_singer only, to answer
`SELECT count(*) FROM singer` and `SELECT Name FROM stadium`; on the other databases it writes
those names again, which they lack. Unconstrained, most of its answers name an absent table;
constrained, none can. One more question's database has a schema that yields no grammar
(a column name with a control character): it decodes unconstrained, its reason counted."""

from __future__ import annotations

import json

import pytest

from sqlrl.eval.evaluate import ConstrainedFormatError, Split, evaluate_model
from sqlrl.formats import FORMATS
from sqlrl.jsonio import read_json
from sqlrl.params import CONSTRAINED_ROLLOUTS, ParamsError
from sqlrl.request_input import RequestInput
from sqlrl.sql.grammar import accepts, matcher_for
from sqlrl.sql.identifiers import absent_names
from tests.repo_tools import eval_params, fixed_params
from tests.serve_helpers import SETTINGS, train_served_model

pytest.importorskip("xgrammar")

DATABASES = ("concert_singer", "pets_1", "car_1", "flight_2", "employee_hire_evaluation")
BROKEN = "concert_broken"  # concert_singer's schema with a name no SQL can write
PER_DATABASE = 2


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    return train_served_model(tmp_path_factory.mktemp("served"))


@pytest.fixture(scope="module")
def split(spider_dir, tmp_path_factory):
    """Two dev questions per database and one on BROKEN (concert_singer's file), with the
    prompts the model was trained with, and a tables file of those schemas."""
    folder = tmp_path_factory.mktemp("constrained_split")
    entries = {e["db_id"]: e for e in json.loads((spider_dir / "tables.json").read_text())}
    broken = json.loads(json.dumps(entries["concert_singer"]))
    broken["db_id"] = BROKEN
    broken["column_names_original"][1][1] = "Stadium\x01ID"
    tables = folder / "tables.json"
    tables.write_text(json.dumps([entries[db] for db in DATABASES] + [broken]))
    dev = json.loads((spider_dir / "dev.json").read_text())
    builder = RequestInput(SETTINGS, spider_dir)
    rows = []
    for db in DATABASES + (BROKEN,):
        source = "concert_singer" if db == BROKEN else db
        for item in [x for x in dev if x["db_id"] == source][: 1 if db == BROKEN else PER_DATABASE]:
            rows.append(
                {
                    "question": item["question"],
                    "gold": item["query"],
                    "db_id": db,
                    "prompt": builder.messages(item["question"], db_id=source),
                    "db_path": str(spider_dir / "database" / source / f"{source}.sqlite"),
                }
            )
    path = folder / "dev.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return Split(path, tables, required=True)


def _evaluate(model, split, constrained: bool):
    params = eval_params(max_new_tokens=24, batch_size=8, constrained=constrained)
    metrics, predictions = evaluate_model(model, params, 0, {"dev": split}, progress=False)
    return metrics["dev"], predictions["dev"]


@pytest.fixture(scope="module")
def runs(served, split):
    """(metrics, predictions) unconstrained, then constrained."""
    return _evaluate(served, split, False), _evaluate(served, split, True)


@pytest.fixture(scope="module")
def schemas(split):
    from sqlrl.data.spider import load_schemas

    return load_schemas(split.tables_json)


def test_constrained_answers_name_only_their_databases_tables_and_columns(runs, schemas):
    (free, free_preds), (metrics, preds) = runs
    # unconstrained: the memorised concert_singer names, on databases that lack them
    assert "constrained" not in free
    assert free["absent_identifier_share"] >= 0.5
    assert any("singer" in (absent_names(p["pred"], schemas[p["db_id"]]) or []) for p in free_preds)

    assert metrics["absent_identifier_share"] == 0.0
    finished = unfinished = 0
    for p in preds:
        if p["db_id"] == BROKEN:
            continue
        matcher = matcher_for(schemas[p["db_id"]])
        assert matcher.accept_string(p["output"])  # each character on a path of the grammar
        if accepts(p["output"], matcher):  # a whole query: it parses and names only the schema's
            assert absent_names(p["pred"], schemas[p["db_id"]]) == []
            finished += p["db_id"] != "concert_singer"
        else:
            unfinished += 1  # cut at max_new_tokens mid-query
    assert finished >= 3  # the constraint turned `FROM singer` into the database's own names
    grammar = metrics["constrained"]
    assert grammar["grammar_rows"] == len(DATABASES) * PER_DATABASE
    assert grammar["unfinished"] == unfinished and grammar["finished_naming_absent"] == 0
    assert grammar["dead_ends"] == 0  # a byte-level vocabulary spells whatever the grammar needs
    assert grammar["compile_seconds"] > 0
    assert metrics["n"] == free["n"] == len(preds)


def test_a_schema_without_a_grammar_decodes_unconstrained_and_is_counted(runs):
    (_, free_preds), (metrics, preds) = runs
    grammar = metrics["constrained"]
    assert grammar["fallback_rows"] == 1
    ((reason, count),) = grammar["fallback_reasons"].items()
    assert count == 1 and "control character" in reason and "Stadium\\x01ID" in reason
    broken = [k for k, p in enumerate(preds) if p["db_id"] == BROKEN]
    assert len(broken) == 1
    # its slot in the batch decodes as it does without a grammar, token for token
    assert preds[broken[0]]["output"] == free_preds[broken[0]]["output"]


def test_the_stage_summary_shows_the_names_and_the_grammar_counts(runs):
    from stages.evaluate import _summary

    (free, _), (metrics, _) = runs
    assert ", absent names 0.0% [constrained 10, fallback 1, unfinished " in _summary(
        "tiny", {"dev": metrics}
    )
    line = _summary("tiny", {"dev": free})
    assert f", absent names {100 * free['absent_identifier_share']:.1f}%" in line
    assert "[constrained" not in line


def test_the_agent_format_is_refused(served, split, tmp_path):
    """The grammar reaches the sql format's completion and the reasoning format's answer span,
    not the agent's tool-call argument: an agent model is refused, by params and by the
    model's folder."""
    assert CONSTRAINED_ROLLOUTS == tuple(
        name for name, f in FORMATS.items() if f.grammar_constrained
    )
    with pytest.raises(ParamsError, match="eval.constrained covers the sql/reasoning answer"):
        fixed_params("eval.constrained=true", "grpo.rollout=agent", "base.tokenizer=qwen2.5")
    assert fixed_params("eval.constrained=true", "grpo.rollout=reasoning").eval.constrained
    folder = tmp_path / "agent_model"
    folder.mkdir()
    (folder / "sqlrl_prompt.json").write_text(json.dumps({"rollout": "agent"}))
    with pytest.raises(ConstrainedFormatError, match="'agent' format"):
        evaluate_model(folder, eval_params(constrained=True), 0, {"dev": split})


def test_the_stage_puts_constrained_ex_beside_unconstrained_on_every_set(
    served, split, spider_dir, tmp_path
):
    """`evaluate@final_constrained` in dvc.yaml: the stage's --constrained decodes under the
    grammar though params leave eval.constrained off, and --baseline/--baseline-sets pair it
    with the unconstrained run on dev and on each evaluation set. An agent model (its query is
    inside a tool call) gets metrics that say why, not a failed pipeline."""
    import shutil

    import yaml

    from stages import evaluate as stage
    from stages import parse_stage_args
    from tests.repo_tools import fixed_params_dict

    params = fixed_params_dict("eval.max_new_tokens=24", "eval.batch_size=8", "eval.use_vllm=false")
    params["eval"].update(num_samples=1, vote_models=[], constrained=False)
    spec = {"format": "spider", "questions": "q.json", "tables": split.tables_json.name}
    params["eval"]["sets"] = {"copy": {**params["eval"]["sets"]["spider_dk"], **spec}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    (tmp_path / "sets").mkdir()
    shutil.copy(split.rows, tmp_path / "sets" / "copy.jsonl")
    empty = tmp_path / "heldout.jsonl"
    empty.write_text("")
    out = tmp_path / "predictions"

    def run(model, name: str, *extra: str) -> int:
        argv = ["--model", str(model), "--spider", str(spider_dir), "--dev", str(split.rows)]
        argv += ["--heldout", str(empty), "--sets", str(tmp_path / "sets")]
        argv += ["--raw", str(split.tables_json.parent), "--params", str(tmp_path / "params.yaml")]
        argv += ["--predictions", str(out / f"{name}.jsonl"), "--set-predictions"]
        argv += [str(out / f"{name}_sets"), "--heldout-predictions", str(out / f"{name}_h.jsonl")]
        argv += ["--metrics", str(tmp_path / f"eval_{name}.json")]
        argv += ["--headline", str(tmp_path / f"headline_{name}.json"), *extra]
        return stage.main(parse_stage_args("evaluate", stage.arguments, argv=argv))

    against_free = ["--baseline", "final", str(out / "final.jsonl"), str(out / "final_h.jsonl")]
    against_free += ["--baseline-sets", str(out / "final_sets")]
    assert run(served, "final") == 0
    assert run(served, "final_constrained", "--constrained", *against_free) == 0
    free, constrained = (
        read_json(tmp_path / f"eval_{n}.json") for n in ("final", "final_constrained")
    )
    assert "constrained" not in free["dev"] and free["dev"]["absent_identifier_share"] > 0.5
    for split_name in ("dev", "copy"):
        assert constrained[split_name]["constrained"]["grammar_rows"] == 10
        assert constrained[split_name]["absent_identifier_share"] == 0.0
        assert constrained[split_name]["constrained"]["finished_naming_absent"] == 0
        paired = constrained["vs_final"][split_name]
        assert paired["n"] == free[split_name]["n"]
        diff = constrained[split_name]["ex"] - free[split_name]["ex"]
        assert paired["diff"] == pytest.approx(diff, abs=1e-4)
    headline = read_json(tmp_path / "headline_final_constrained.json")
    assert headline["gain"] == {"dev": constrained["vs_final"]["dev"]["diff"]}  # sets: vs_final

    agent = tmp_path / "agent_model"
    shutil.copytree(served, agent)
    (agent / "sqlrl_prompt.json").write_text(json.dumps({"rollout": "agent"}))
    assert run(agent, "a", "--constrained", *against_free) == 0
    assert "'agent' format" in read_json(tmp_path / "eval_a.json")["constrained_unavailable"]
    assert (out / "a.jsonl").read_text() == "" and (out / "a_sets" / "copy.jsonl").exists()
