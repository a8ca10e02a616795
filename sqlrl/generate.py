"""Batched generation backends for evaluation: transformers everywhere, vLLM where installed.

A backend is anything with the `Generator` protocol: rendered prompt strings in, completion
strings out, in the order given. `generate` is greedy (one completion per prompt);
`sample` draws `n` completions per prompt at a temperature (self-consistency).

- `HFGenerator` (transformers): prompts sorted by token length and batched (less padding),
  left padding, KV cache, its own GenerationConfig (the model's generation_config.json, e.g.
  Qwen's sampling defaults and repetition penalty, is not used, so greedy is plain greedy),
  stops at EOS (<|im_end|> and the tokenizer's eos), cuts at `max_new_tokens`, a tqdm bar
  on stderr. Results come back in the original order.
- `VLLMGenerator`: vLLM's LLM + SamplingParams (temperature 0 for greedy). vLLM is imported
  lazily, only when this class is built, so nothing here needs it installed.

`make_generator(model_dir, params, seed)` picks one from the `eval` params.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

IM_END = "<|im_end|>"


@runtime_checkable
class Generator(Protocol):
    def generate(self, prompts: list[str]) -> list[str]:
        """One greedy completion per prompt, in the prompts' order."""
        ...

    def sample(self, prompts: list[str], n: int, temperature: float,
               seed: int) -> list[list[str]]:
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


def cut_at_stop(ids: Sequence[int], stop_ids: Sequence[int],
                max_new_tokens: int | None = None) -> list[int]:
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


class HFGenerator:
    """Batched generation with a transformers causal LM (see the module docstring)."""

    def __init__(self, model, tokenizer, batch_size: int, max_new_tokens: int,
                 progress: bool = True, desc: str = "generate"):
        if batch_size < 1 or max_new_tokens < 1:
            raise ValueError("batch_size and max_new_tokens must be >= 1")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.progress = progress
        self.desc = desc
        self.stop_ids = stop_token_ids(tokenizer, model)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_ids[0]
        self.generated_tokens = 0  # completion tokens produced so far (for tokens/s)

    # ------------------------------------------------------------------ public API
    def generate(self, prompts: list[str]) -> list[str]:
        return [self._decode(ids) for ids in self.generate_ids(prompts)]

    def sample(self, prompts: list[str], n: int, temperature: float,
               seed: int) -> list[list[str]]:
        groups = self.generate_ids(prompts, n=n, temperature=temperature, seed=seed)
        return [[self._decode(ids) for ids in group] for group in groups]

    def generate_ids(self, prompts: list[str], n: int = 1, temperature: float = 0.0,
                     seed: int = 0) -> list:
        """Completion token ids per prompt: a list of ids (n == 1, greedy when temperature is
        0) or a list of n lists of ids (n > 1, sampled), in the prompts' order."""
        import torch
        from tqdm.auto import tqdm
        from transformers import set_seed

        if n < 1:
            raise ValueError("n must be >= 1")
        sampling = temperature > 0.0
        if n > 1 and not sampling:
            raise ValueError("n > 1 needs a temperature > 0 (greedy gives one answer)")
        encoded = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        order = length_order([len(e) for e in encoded])
        config = self._generation_config(n, temperature)
        if sampling:
            set_seed(seed)
        results: list = [None] * len(prompts)
        device = self.model.device
        with tqdm(total=len(prompts), desc=self.desc, unit="ex", file=sys.stderr,
                  disable=not self.progress, dynamic_ncols=True) as bar, torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                batch = order[start:start + self.batch_size]
                input_ids, attention_mask = self._left_pad([encoded[i] for i in batch])
                out = self.model.generate(input_ids=input_ids.to(device),
                                          attention_mask=attention_mask.to(device),
                                          generation_config=config)
                new = out[:, input_ids.shape[1]:].tolist()
                for k, i in enumerate(batch):
                    rows = [cut_at_stop(ids, self.stop_ids, self.max_new_tokens)
                            for ids in new[k * n:(k + 1) * n]]
                    self.generated_tokens += sum(len(r) for r in rows)
                    results[i] = rows[0] if n == 1 else rows
                bar.update(len(batch))
        return results

    # ------------------------------------------------------------------ internals
    def _left_pad(self, seqs: list[list[int]]):
        import torch

        width = max(len(s) for s in seqs)
        ids = [[self.pad_id] * (width - len(s)) + list(s) for s in seqs]
        mask = [[0] * (width - len(s)) + [1] * len(s) for s in seqs]
        return torch.tensor(ids, dtype=torch.long), torch.tensor(mask, dtype=torch.long)

    def _generation_config(self, n: int, temperature: float):
        from transformers import GenerationConfig

        common = dict(max_new_tokens=self.max_new_tokens, eos_token_id=list(self.stop_ids),
                      pad_token_id=self.pad_id, use_cache=True, num_return_sequences=n)
        if temperature > 0.0:
            return GenerationConfig(do_sample=True, temperature=temperature, top_p=1.0,
                                    top_k=0, **common)
        return GenerationConfig(do_sample=False, **common)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class VLLMGenerator:
    """Generation with vLLM (GPU). Imported lazily: building this class needs vLLM installed."""

    def __init__(self, model_path: str, max_new_tokens: int, seed: int,
                 stop_ids: Sequence[int] = (), dtype: str = "auto", **llm_kwargs):
        import vllm  # lazy: CUDA-only, absent from the CPU install

        self._vllm = vllm
        self.max_new_tokens = max_new_tokens
        self.stop_ids = list(stop_ids)
        self.llm = vllm.LLM(model=model_path, tokenizer=model_path, dtype=dtype, seed=seed,
                            **llm_kwargs)

    def _params(self, n: int, temperature: float, seed: int | None):
        kwargs = dict(n=n, temperature=temperature, max_tokens=self.max_new_tokens)
        if self.stop_ids:
            kwargs["stop_token_ids"] = list(self.stop_ids)
        if temperature > 0.0:
            kwargs.update(top_p=1.0, seed=seed)
        return self._vllm.SamplingParams(**kwargs)

    def generate(self, prompts: list[str]) -> list[str]:
        if not prompts:
            return []
        outputs = self.llm.generate(list(prompts), self._params(1, 0.0, None))
        return [o.outputs[0].text for o in outputs]

    def sample(self, prompts: list[str], n: int, temperature: float,
               seed: int) -> list[list[str]]:
        if not prompts:
            return []
        outputs = self.llm.generate(list(prompts), self._params(n, temperature, seed))
        return [[c.text for c in o.outputs] for o in outputs]


def vllm_available() -> bool:
    """Whether `import vllm` works (it is installed only on CUDA machines)."""
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def make_generator(model_dir: str | Path, params, seed: int, progress: bool = True,
                   desc: str = "generate"):
    """(generator, tokenizer) for `model_dir` from the `eval` params: vLLM when
    `params.use_vllm` and vLLM is installed, transformers otherwise."""
    from sqlrl.modeling import load_model_and_tokenizer, load_tokenizer, model_location

    if params.use_vllm and vllm_available():
        tokenizer = load_tokenizer(model_dir)
        path, _ = model_location(model_dir)
        record = _base_record(model_dir)
        generator = VLLMGenerator(path, params.max_new_tokens, seed,
                                  stop_ids=stop_token_ids(tokenizer),
                                  dtype=record.get("dtype", "auto"))
        return generator, tokenizer
    if params.use_vllm:
        print("evaluate: eval.use_vllm is set but vLLM is not installed; using transformers",
              file=sys.stderr)
    import torch

    model, tokenizer = load_model_and_tokenizer(model_dir)
    if torch.cuda.is_available():
        model = model.to("cuda")
    return HFGenerator(model, tokenizer, params.batch_size, params.max_new_tokens,
                       progress=progress, desc=desc), tokenizer


def _base_record(model_dir) -> dict:
    from sqlrl.modeling import read_base_record
    return read_base_record(model_dir) or {}
