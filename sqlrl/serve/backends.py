"""Generation backends for the server: vLLM where installed, transformers otherwise.

- `BatchingBackend` wraps any `sqlrl.model.generate.Generator` (HFGenerator, VLLMGenerator, a test
  double). An asyncio micro-batcher collects concurrent requests for `batch_wait_s` (or until
  `max_batch_size`), groups them by sampling settings, and runs each group as one batched call
  in a single worker thread, so the event loop keeps serving while the model runs.
- `AsyncVLLMBackend`: vLLM's AsyncLLMEngine, which batches continuously by itself. Its
  generate() streams by default, and with n > 1 each streamed output carries only the samples
  that changed, so requests ask for the final output only and collect samples by index.

Schema-constrained decoding (`--constrained`, docs/grammar.md): each backend's `grammar_for`
gives a database's grammar (the generator's: transformers' compiled grammar, vLLM's EBNF
text; None where the generator has none), and `complete(..., grammar=...)` decodes one request
under it. The batching backend passes each item's grammar as its row's (`grammars=`), so
requests with different grammars, or none, still share a batch; a batch without any grammar
calls the generator exactly as before. AsyncVLLMBackend puts the text in the request's
SamplingParams (`structured_outputs`).

Decoding is explicit in every backend (sqlrl.model.generate): greedy is argmax, sampling is plain
temperature sampling; nothing comes from the model's generation_config.json. The context
limit is the engine's (vLLM's max_model_len) or the model config's, so an over-long prompt
is refused (413) before it reaches the model.

`make_backend` picks one: vLLM (AsyncLLMEngine, else LLM) when installed and asked for, falling
back to transformers with a warning when vLLM is absent or its engine cannot start.
Every request has a deadline at the caller (`asyncio.wait_for`); a request that expired while
queued is dropped before it reaches the model. A full queue is `Busy` (503).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("sqlrl.serve")


class Busy(RuntimeError):
    """The request queue is full (HTTP 503)."""


class NotReady(RuntimeError):
    """The backend is not started or is shutting down (HTTP 503)."""


@dataclass
class _Item:
    prompt: str
    n: int
    temperature: float
    max_new_tokens: int
    seed: int
    future: asyncio.Future
    grammar: object = None  # the generator's grammar_for(schema) for this request, or None


@dataclass
class BatchStats:
    requests: int = 0
    batches: int = 0
    largest_batch: int = 0
    expired: int = 0
    failed_batches: int = 0

    def as_dict(self) -> dict:
        return {
            "requests": self.requests,
            "batches": self.batches,
            "largest_batch": self.largest_batch,
            "expired_in_queue": self.expired,
            "failed_batches": self.failed_batches,
        }


class BatchingBackend:
    """A Generator behind an asyncio micro-batcher (see the module docstring)."""

    def __init__(
        self,
        generator,
        tokenizer,
        *,
        name: str,
        model_path: str,
        max_batch_size: int = 8,
        batch_wait_s: float = 0.01,
        max_queue: int = 256,
        context_length: int | None = None,
    ):
        if max_batch_size < 1 or max_queue < 1:
            raise ValueError("max_batch_size and max_queue must be >= 1")
        self.generator = generator
        self.tokenizer = tokenizer
        self.name = name
        self.model_path = model_path
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.max_queue = max_queue
        self.context_length = context_length
        self.stats = BatchStats()
        self._queue: asyncio.Queue | None = None
        self._task: asyncio.Task | None = None
        self._pool: ThreadPoolExecutor | None = None

    # ------------------------------------------------------------------ lifecycle
    async def start(self) -> None:
        self._queue = asyncio.Queue(self.max_queue)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlrl-generate")
        self._task = asyncio.create_task(self._loop(), name="sqlrl-batcher")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None
        if self._queue is not None:
            while not self._queue.empty():
                item = self._queue.get_nowait()
                if not item.future.done():
                    item.future.set_exception(NotReady("the server is shutting down"))
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def info(self) -> dict:
        return {
            "batching": {
                "max_batch_size": self.max_batch_size,
                "batch_wait_ms": round(self.batch_wait_s * 1000, 3),
                "max_queue": self.max_queue,
                "queued": self._queue.qsize() if self._queue else 0,
                **self.stats.as_dict(),
            }
        }

    # ------------------------------------------------------------------ requests
    @property
    def grammar_for(self):
        """The generator's `grammar_for(schema)` (None: it cannot decode under a grammar)."""
        return getattr(self.generator, "grammar_for", None)

    async def complete(
        self,
        prompt: str,
        *,
        n: int = 1,
        temperature: float = 0.0,
        max_new_tokens: int = 128,
        seed: int = 0,
        grammar=None,
    ) -> list[str]:
        """`n` completions of `prompt` (greedy when temperature is 0), under `grammar` (the
        generator's `grammar_for`'s) when one is given."""
        if self._queue is None or self._task is None or self._task.done():
            raise NotReady("the generation backend is not running")
        if grammar is not None and self.grammar_for is None:
            raise TypeError(f"{type(self.generator).__name__} cannot decode under a grammar")
        future = asyncio.get_running_loop().create_future()
        try:
            self._queue.put_nowait(
                _Item(prompt, n, temperature, max_new_tokens, seed, future, grammar)
            )
        except asyncio.QueueFull:
            raise Busy(
                f"the server is busy: {self.max_queue} requests are already queued; retry later"
            ) from None
        self.stats.requests += 1
        return await future

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._queue.get()]
            if self._queue.qsize() < self.max_batch_size - 1 and self.batch_wait_s > 0:
                await asyncio.sleep(self.batch_wait_s)  # let concurrent requests arrive
            while len(batch) < self.max_batch_size and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            live = [item for item in batch if not item.future.done()]
            self.stats.expired += len(batch) - len(live)
            for group in self._groups(live):
                try:
                    results = await loop.run_in_executor(self._pool, self._run_group, group)
                except Exception as exc:  # noqa: BLE001 - every waiter gets the failure
                    self.stats.failed_batches += 1
                    log.exception("generation failed for a batch of %d", len(group))
                    for item in group:
                        if not item.future.done():
                            item.future.set_exception(exc)
                    continue
                self.stats.batches += 1
                self.stats.largest_batch = max(self.stats.largest_batch, len(group))
                for item, texts in zip(group, results, strict=False):
                    if not item.future.done():
                        item.future.set_result(texts)

    def _groups(self, items: list[_Item]) -> list[list[_Item]]:
        """Items that can share one call: same n, temperature, seed (and, unless the generator
        can cut per request, the same max_new_tokens). Order within a group is kept. Grammars
        do not split a group: each row has its own (`grammars=`)."""
        per_request_cut = hasattr(self.generator, "generate_ids")

        def key(item: _Item):
            return (
                item.n,
                item.temperature,
                item.seed if item.temperature > 0 else 0,
                None if per_request_cut else item.max_new_tokens,
            )

        groups: dict = {}
        for item in items:
            groups.setdefault(key(item), []).append(item)
        return list(groups.values())

    def _run_group(self, group: list[_Item]) -> list[list[str]]:
        """One batched call (in the worker thread): n texts per item, in the items' order."""
        first = group[0]
        prompts = [item.prompt for item in group]
        gen = self.generator
        # one grammar or None per row; no argument at all for a batch without any grammar
        grammars = [item.grammar for item in group]
        constrained = {"grammars": grammars} if any(g is not None for g in grammars) else {}
        if hasattr(gen, "generate_ids"):  # HFGenerator: one call, each cut at its own limit
            gen.max_new_tokens = max(item.max_new_tokens for item in group)
            ids = gen.generate_ids(
                prompts, n=first.n, temperature=first.temperature, seed=first.seed, **constrained
            )
            out = []
            for item, row in zip(group, ids, strict=False):
                rows = [row] if first.n == 1 else row
                out.append(
                    [
                        gen.tokenizer.decode(r[: item.max_new_tokens], skip_special_tokens=True)
                        for r in rows
                    ]
                )
            return out
        if hasattr(gen, "max_new_tokens"):
            gen.max_new_tokens = first.max_new_tokens
        if first.n == 1 and first.temperature <= 0:
            texts = gen.generate(prompts, **constrained)
            out = [[t] for t in texts]
        else:
            samples = gen.sample(prompts, first.n, first.temperature, first.seed, **constrained)
            out = [list(g) for g in samples]
        if len(out) != len(prompts):
            raise RuntimeError(
                f"the generator returned {len(out)} results for {len(prompts)} prompts"
            )
        return out


class AsyncVLLMBackend:
    """vLLM's AsyncLLMEngine: each request is submitted directly (the engine batches)."""

    name = "vllm-async"

    def __init__(self, vllm, engine, tokenizer, *, model_path: str, stop_ids=()):
        self._vllm = vllm
        self.engine = engine
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.stop_ids = list(stop_ids)
        self.context_length = engine_context_length(engine)
        self._ids = itertools.count()
        self.requests = 0

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        shutdown = getattr(self.engine, "shutdown", None)
        if callable(shutdown):
            result = shutdown()
            if asyncio.iscoroutine(result):
                await result

    def info(self) -> dict:
        return {"engine": "AsyncLLMEngine", "requests": self.requests}

    def grammar_for(self, schema, compose=None) -> str:
        """The EBNF text of `schema`'s queries (in the answer `compose` makes of them), read by
        xgrammar here (a grammar it cannot read is GrammarUnavailable, a fallback, not a failed
        request); the engine compiles it."""
        from sqlrl.sql.grammar import checked_grammar_text

        return checked_grammar_text(schema, compose)

    def sampling_params(
        self, n: int, temperature: float, max_new_tokens: int, seed: int, grammar=None
    ):
        """Every decoding field explicit (sqlrl.model.generate.vllm_sampling_settings), and the
        final output only: the default (CUMULATIVE) streams one sample per output. `grammar`
        (grammar_for's text): the request decodes under it (`structured_outputs`); None: no
        structured_outputs at all."""
        from vllm.sampling_params import RequestOutputKind

        from sqlrl.model.generate import vllm_sampling_settings

        settings = vllm_sampling_settings(n, temperature, max_new_tokens, self.stop_ids, seed)
        if grammar is not None:
            from vllm.sampling_params import StructuredOutputsParams

            settings["structured_outputs"] = StructuredOutputsParams(grammar=grammar)
        return self._vllm.SamplingParams(**settings, output_kind=RequestOutputKind.FINAL_ONLY)

    async def complete(
        self,
        prompt: str,
        *,
        n: int = 1,
        temperature: float = 0.0,
        max_new_tokens: int = 128,
        seed: int = 0,
        grammar=None,
    ) -> list[str]:
        params = self.sampling_params(n, temperature, max_new_tokens, seed, grammar)
        request_id = f"sqlrl-{next(self._ids)}"
        self.requests += 1
        texts: dict[int, str] = {}
        try:
            async for output in self.engine.generate(prompt, params, request_id):
                for completion in output.outputs:  # by index: an output may hold only some
                    texts[completion.index] = completion.text
        except asyncio.CancelledError:
            abort = getattr(self.engine, "abort", None)
            if callable(abort):
                result = abort(request_id)
                if asyncio.iscoroutine(result):
                    await result
            raise
        if sorted(texts) != list(range(n)):
            raise RuntimeError(f"vLLM returned {len(texts)} of the {n} samples asked for")
        return [texts[i] for i in range(n)]


# --------------------------------------------------------------------------- selection

BACKENDS = ("auto", "transformers", "vllm")


@dataclass(frozen=True)
class BackendOptions:
    backend: str = "auto"  # auto | transformers | vllm
    vllm_engine: str = "auto"  # auto (AsyncLLMEngine if present) | async | llm
    max_batch_size: int = 8
    batch_wait_s: float = 0.01
    max_queue: int = 256
    default_max_new_tokens: int = 128
    seed: int = 0
    dtype: str | None = None
    device: str | None = None  # transformers: cuda when available, else cpu
    torch_threads: int = 0  # transformers on CPU: torch threads (0: the usable cores)


def _context_length(config) -> int | None:
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def engine_context_length(engine) -> int:
    """The context vLLM enforces: its model config's max_model_len (the model's own or the
    engine's max_model_len argument). vLLM refuses a longer prompt with a validation error."""
    return int(engine.model_config.max_model_len)


def _load_vllm(model_dir: str | Path, opts: BackendOptions):
    import vllm

    from sqlrl.model.generate import VLLM_ENGINE_SETTINGS, VLLMGenerator, stop_token_ids
    from sqlrl.model.modeling import load_tokenizer, model_location, read_base_record

    tokenizer = load_tokenizer(model_dir)
    path, _ = model_location(model_dir)
    dtype = opts.dtype or (read_base_record(model_dir) or {}).get("dtype", "auto")
    stops = stop_token_ids(tokenizer)
    use_async = opts.vllm_engine == "async" or (
        opts.vllm_engine == "auto"
        and hasattr(vllm, "AsyncLLMEngine")
        and hasattr(vllm, "AsyncEngineArgs")
    )
    if use_async:
        args = vllm.AsyncEngineArgs(
            model=path, tokenizer=path, dtype=dtype, seed=opts.seed, **VLLM_ENGINE_SETTINGS
        )
        engine = vllm.AsyncLLMEngine.from_engine_args(args)
        return AsyncVLLMBackend(vllm, engine, tokenizer, model_path=str(model_dir), stop_ids=stops)
    generator = VLLMGenerator(
        path, opts.default_max_new_tokens, opts.seed, stop_ids=stops, dtype=dtype
    )
    return BatchingBackend(
        generator,
        tokenizer,
        name="vllm",
        model_path=str(model_dir),
        max_batch_size=max(opts.max_batch_size, 64),
        batch_wait_s=opts.batch_wait_s,
        max_queue=opts.max_queue,
        context_length=engine_context_length(generator.llm),
    )


def _load_transformers(model_dir: str | Path, opts: BackendOptions):
    import torch

    from sqlrl.hardware import set_torch_threads
    from sqlrl.model.generate import HFGenerator
    from sqlrl.model.modeling import load_model_and_tokenizer

    set_torch_threads(opts.torch_threads)
    model, tokenizer = load_model_and_tokenizer(model_dir, dtype=opts.dtype)
    device = opts.device or ("cuda" if torch.cuda.is_available() else "cpu")
    model = model.to(device)
    generator = HFGenerator(
        model,
        tokenizer,
        batch_size=opts.max_batch_size,
        max_new_tokens=opts.default_max_new_tokens,
        progress=False,
    )
    return BatchingBackend(
        generator,
        tokenizer,
        name="transformers",
        model_path=str(model_dir),
        max_batch_size=opts.max_batch_size,
        batch_wait_s=opts.batch_wait_s,
        max_queue=opts.max_queue,
        context_length=_context_length(model.config),
    )


def make_backend(model_dir: str | Path, opts: BackendOptions):
    """The backend for `model_dir`: vLLM if asked for (or auto) and usable, else transformers."""
    from sqlrl.model.generate import vllm_available

    if opts.backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {opts.backend!r}")
    if opts.backend in ("auto", "vllm"):
        if vllm_available():
            try:
                return _load_vllm(model_dir, opts)
            except Exception as exc:  # noqa: BLE001 - e.g. no GPU: serve with transformers
                log.warning(
                    "vLLM could not start (%s: %s); using transformers", type(exc).__name__, exc
                )
        elif opts.backend == "vllm":
            log.warning("--backend vllm but vLLM is not installed; using transformers")
    return _load_transformers(model_dir, opts)
