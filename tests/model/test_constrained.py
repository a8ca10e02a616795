"""Schema-constrained decoding with transformers (sqlrl/model/constrained.py, HFGenerator's
`grammars=`) on the tests' tiny random model and Spider's real schemas.

The reference decoder here is the plain one (one full forward pass per token, argmax), with
each step's logits masked by an xgrammar GrammarMatcher when the row has a grammar: batched,
left-padded, shared-prefix generation must give exactly its tokens, constrained or not."""

from __future__ import annotations

import pytest
import torch

from sqlrl.data.spider import load_schemas
from sqlrl.model import generate as gen
from sqlrl.sql.grammar import matcher_for

xgr = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def schemas(spider_dir):
    return load_schemas(spider_dir / "tables.json")


def _reference(model, tokenizer, prompt, stops, max_new_tokens, compiled=None):
    """Argmax decoding one full forward pass per token, masked by `compiled`'s matcher."""
    matcher = xgr.GrammarMatcher(compiled) if compiled is not None else None
    bitmask = xgr.allocate_token_bitmask(1, model.config.vocab_size)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    out = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids + out])).logits[0, -1].float()[None]
            if matcher is not None:
                matcher.fill_next_token_bitmask(bitmask)
                xgr.apply_token_bitmask_inplace(logits, bitmask)
            token = int(logits.argmax())
            if token in stops:
                break
            if matcher is not None:
                assert matcher.accept_token(token)
            out.append(token)
    return out


def _on_path(matcher, text: str) -> bool:
    """Whether every character of `text` is on a path of the matcher's grammar (a prefix
    of a query it accepts; a whole one or not)."""
    matcher.reset()
    return bool(matcher.accept_string(text))


def test_without_grammars_nothing_changes_and_each_row_decodes_under_its_own(
    tiny, prompts, schemas
):
    """Unconstrained rows, alone or beside constrained ones in a batch, give the reference's
    tokens, as before grammars existed; constrained rows give the masked reference's, and
    differ: the random model's free text is no SQL."""
    model, tokenizer, _ = tiny
    g = gen.HFGenerator(model, tokenizer, batch_size=3, max_new_tokens=12, progress=False)
    stops = g.stop_ids
    free = [_reference(model, tokenizer, p, stops, 12) for p in prompts]
    assert g.generate_ids(prompts) == free
    assert g.generate_ids(prompts, grammars=[None] * len(prompts)) == free

    concert, pets = g.grammar_for(schemas["concert_singer"]), g.grammar_for(schemas["pets_1"])
    grammars = [concert, None, pets, None, concert]
    mixed = g.generate_ids(prompts, grammars=grammars)
    for k, prompt in enumerate(prompts):
        assert mixed[k] == _reference(model, tokenizer, prompt, stops, 12, grammars[k])
    assert [mixed[1], mixed[3]] == [free[1], free[3]]
    assert all(mixed[k] != free[k] for k in (0, 2, 4))
    texts = g.generate(prompts, grammars=grammars)
    assert texts == [tokenizer.decode(x, skip_special_tokens=True) for x in mixed]
    for k, db in ((0, "concert_singer"), (2, "pets_1"), (4, "concert_singer")):
        assert _on_path(matcher_for(schemas[db]), texts[k])
    concert_matcher = matcher_for(schemas["concert_singer"])
    assert not _on_path(concert_matcher, tokenizer.decode(free[0], skip_special_tokens=True))
    assert g.grammar_dead_ends == 0


def test_tokenizer_info_is_built_once_from_the_model_and_its_stop_tokens(tiny, schemas):
    model, tokenizer, _ = tiny
    g = gen.HFGenerator(model, tokenizer, batch_size=2, max_new_tokens=4, progress=False)
    first = g.grammar_for(schemas["concert_singer"])
    info = g._tokenizer_info
    assert g.grammar_for(schemas["concert_singer"]) is first  # compiled once (the cache)
    g.grammar_for(schemas["pets_1"])
    assert g._tokenizer_info is info
    assert info.vocab_size == model.config.vocab_size
    assert sorted(info.stop_token_ids) == sorted(g.stop_ids)
    with pytest.raises(ValueError, match="1 grammars for 2 prompts"):
        g.generate(["a", "b"], grammars=[first])


def test_sampled_copies_of_a_prompt_share_its_grammar(tiny, prompts, schemas):
    model, tokenizer, _ = tiny
    g = gen.HFGenerator(model, tokenizer, batch_size=2, max_new_tokens=10, progress=False)
    concert = g.grammar_for(schemas["concert_singer"])
    grammars = [concert, None, concert]
    drawn = g.sample(prompts[:3], n=3, temperature=1.0, seed=5, grammars=grammars)
    assert drawn == g.sample(prompts[:3], n=3, temperature=1.0, seed=5, grammars=grammars)
    matcher = matcher_for(schemas["concert_singer"])
    for k in (0, 2):
        assert len(set(drawn[k])) > 1  # it samples
        assert all(_on_path(matcher, text) for text in drawn[k])
    assert not all(_on_path(matcher, text) for text in drawn[1])


def test_a_dead_end_ends_the_row_with_a_stop_token_and_is_counted():
    """A grammar that needs a character no token spells: xgrammar's own processor would mask
    every token (greedy then takes token 0 and its assert fails; sampling draws from NaN).
    Here the row gets the stop token, the other rows go on, and the dead end is counted."""
    from sqlrl.model.constrained import GrammarLogitsProcessor

    vocab = ["S", "E", "L", "</s>"]  # no "C"
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[3])
    compiler = xgr.GrammarCompiler(info)
    sell = compiler.compile_grammar(xgr.Grammar.from_ebnf('root ::= "SELL"'))
    stuck = compiler.compile_grammar(xgr.Grammar.from_ebnf('root ::= "SEL" "C"'))
    processor = GrammarLogitsProcessor([sell, stuck, None], stop_id=3)
    ids = torch.zeros((3, 2), dtype=torch.long)  # the prompt: not accepted by anyone
    chosen = []
    for step in range(6):
        scores = processor(ids, torch.zeros((3, 4)))
        assert not torch.isinf(scores).all(dim=1).any()  # every row keeps a token to take
        token = scores.argmax(dim=1)
        chosen.append(token.tolist())
        if step == 0:
            assert scores[0].tolist() == [0.0] + [float("-inf")] * 3  # only "S"
        ids = torch.cat([ids, token[:, None]], dim=1)
    rows = list(zip(*chosen, strict=True))
    assert rows[0] == (0, 1, 2, 2, 3, 0)  # S E L L, the stop; finished: unmasked again
    assert rows[1] == (0, 1, 2, 3, 0, 0)  # S E L, then no token spells C: the stop token
    assert processor.dead_ends == {1} and processor.completed == {0}
    assert rows[2] == (0,) * 6  # unmasked: the plain argmax (ties: the first token)
