"""Every place the pipeline reaches into TRL's or transformers' internals, in one module.

Each patch was written against, and is tested on, the versions in WRITTEN_FOR (the pins of
requirements.txt). A private name can change or vanish in any release, so each one first
checks the installed version and fails loudly, naming it, on one it was not written for:
check the patch against the new source, then add the version here. Each patch is scoped: it
touches only the object it must and is undone when its `with` block ends.

- completion_logits_only_on_cpu: TRL scores only completion tokens on a Triton device but
  every position elsewhere; on a CPU the vocabulary-sized head over the prompt dominates a step.
- timed_rollouts: the seconds GRPO spends generating and scoring (no public hook times it).
- left_padded_position_ids: the position ids transformers gives a left-padded prompt, so a
  KV cache computed outside `generate` holds the keys `generate` would compute (the shared
  prompt prefill of sqlrl/model/generate.py, which imports this module, never the reverse).
- vllm_cpu_keeps_linear_weights: vLLM's CPU build repacks each linear layer's weights for its
  own GEMM kernels and drops the originals, so a colocated engine cannot take TRL's weight
  sync; keep them in place (on a CPU build only; the GPU path is unchanged).
- per_turn_completion_budget: TRL's tool loop asks each turn for the whole
  max_completion_length and trims afterwards; ask for what the episode has left.
- constrained_rollouts: grpo.constrained's per-prompt grammars; TRL's generation takes one
  decoding setting for a whole batch.
- vllm_generation_wrapped: the GPU rehearsal times TRL's colocated vLLM engine (its start, each
  weight sync, each generate call) from outside; TRL builds it inside the trainer.
"""

from __future__ import annotations

import functools
import importlib.metadata
import time
from contextlib import contextmanager

from sqlrl.errors import PipelineError

# major.minor releases checked
WRITTEN_FOR = {"trl": ("1.16",), "transformers": ("5.17",), "vllm": ("0.32",)}


class UnsupportedVersion(PipelineError, RuntimeError):
    """A patch meets a TRL or transformers release it was not written for."""


def require_written_for(package: str) -> str:
    """The installed version of `package`, when a release the patches were written for."""
    version = _installed_version(package)
    if ".".join(version.split(".")[:2]) not in WRITTEN_FOR[package]:
        raise UnsupportedVersion(
            f"sqlrl/patches.py was written for {package} "
            f"{' or '.join(v + '.x' for v in WRITTEN_FOR[package])}, but {package} {version} is "
            f"installed: install the version requirements.txt pins, or check each patch in "
            f"sqlrl/patches.py against {package} {version} and add it to WRITTEN_FOR"
        )
    return version


def _installed_version(package: str) -> str:
    """The version of the installed module `package`: vLLM's CPU build is the distribution
    `vllm-cpu`, so its version is read from the module, not the distribution's name."""
    if package == "vllm":
        import vllm

        return vllm.__version__
    return importlib.metadata.version(package)


@contextmanager
def completion_logits_only_on_cpu():
    """For the block: TRL 1.16's fused LM head (trl.trainer.utils._use_triton) takes a CPU
    device as a Triton one, so it scores only the completion tokens there too: the same
    log-probabilities, computed eagerly, with the 152k-vocabulary head on ~100 completion
    tokens instead of ~400 prompt + completion tokens. Other devices are unchanged."""
    require_written_for("trl")
    import trl.trainer.utils as trl_utils

    original = trl_utils._use_triton

    def use_triton_or_cpu(device) -> bool:
        return device.type == "cpu" or original(device)

    trl_utils._use_triton = use_triton_or_cpu
    try:
        yield
    finally:
        trl_utils._use_triton = original


@contextmanager
def timed_rollouts(trainer, add_seconds):
    """For the block: each call of the GRPO trainer's rollout step (generation, reward and
    advantages: GRPOTrainer._generate_and_score_completions) adds its wall time through
    add_seconds(seconds). Fails, rather than losing the timing, where the method is gone."""
    require_written_for("trl")
    name = "_generate_and_score_completions"
    own = getattr(trainer, name, None)
    if own is None:
        raise UnsupportedVersion(f"{type(trainer).__name__} has no {name} to time")

    @functools.wraps(own)
    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return own(*args, **kwargs)
        finally:
            add_seconds(time.perf_counter() - start)

    with instance_attribute(trainer, name, timed):
        yield


@contextmanager
def constrained_rollouts(trainer, constrain):
    """For the block: each rollout batch decodes under `constrain(inputs)` (a
    sqlrl.train.constrained.RolloutConstraint: a grammar per row, and the logits processor that
    applies them on the transformers path), and what its `generated()` returns is logged with
    TRL's own metrics.

    Why this hook: TRL 1.16 has no per-prompt constraint. Its transformers path builds one
    GenerationConfig for every row and calls `unwrapped_model.generate(**inputs,
    generation_config=...)` in `_generate_single_turn`, which sees token ids, not the dataset's
    columns; its vLLM path builds one SamplingParams (colocate) or sends one
    `structured_outputs` per request (server), and `vllm_structured_outputs_regex` is one regex
    for all prompts. The dataset's columns (db_id) reach `_generate_and_score_completions(inputs)`
    only, which generates exactly those rows, in their order, in one call (`_generate` ->
    `_generate_single_turn`; no tool loop: the agent format is refused). So that method is
    wrapped, and for its call the one decoding call it makes gets the rows' grammars through
    the library's own per-row entry point: transformers' `generate(logits_processor=[...])`
    (the model's `generate`, which TRL calls on the unwrapped model, as shared_prompt_prefill
    relies on too) or vLLM's `LLM.generate(prompts, sampling_params=[one per prompt])` on the
    colocated engine. A GRPOTrainer subclass would override the same private methods, and
    would replace the trainer class the stage and its tests build.
    Only where this process's engine generates this process's prompts alone: a vLLM server or
    a tensor-parallel engine is refused by params (sqlrl.params, `_check_constrained_vllm`)."""
    require_written_for("trl")
    name = "_generate_and_score_completions"
    own = getattr(trainer, name, None)
    if own is None:
        raise UnsupportedVersion(f"{type(trainer).__name__} has no {name} to constrain")
    if trainer.use_vllm:
        engine = trainer.vllm_generation
        if engine.mode != "colocate" or engine.tensor_parallel_size > 1:
            raise UnsupportedVersion(
                "grpo.constrained needs a colocated vLLM engine without tensor parallelism"
            )
        holder, method = trainer.vllm_generation.llm, "generate"
    else:
        holder, method = trainer.model, "generate"

    @functools.wraps(own)
    def constrained(inputs, *args, **kwargs):
        constraint = constrain(inputs)
        if all(g is None for g in constraint.rows):
            _log_metrics(trainer, constraint.generated())
            return own(inputs, *args, **kwargs)
        calls = []
        inner = getattr(holder, method)

        def decode(*call_args, **call_kwargs):
            if calls:
                raise RuntimeError("grpo.constrained: a rollout batch decoded twice (a tool loop?)")
            calls.append(1)
            if trainer.use_vllm:
                prompts = call_args[0] if call_args else call_kwargs["prompts"]
                if len(prompts) != len(constraint.rows):
                    raise RuntimeError(
                        f"{len(prompts)} prompts for {len(constraint.rows)} rollout grammars"
                    )
                call_kwargs["sampling_params"] = _per_prompt_grammars(
                    call_kwargs.get("sampling_params"), constraint.rows
                )
            else:
                given = list(call_kwargs.pop("logits_processor", None) or [])
                call_kwargs["logits_processor"] = [*given, constraint.processor]
            out = inner(*call_args, **call_kwargs)
            _log_metrics(trainer, constraint.generated())
            return out

        with instance_attribute(holder, method, decode):
            return own(inputs, *args, **kwargs)

    with instance_attribute(trainer, name, constrained):
        yield


def _per_prompt_grammars(sampling_params, grammars: list):
    """One vLLM SamplingParams per prompt: TRL's, with the prompt's grammar (EBNF text) in
    `structured_outputs` (None: TRL's as it is)."""
    from vllm.sampling_params import StructuredOutputsParams

    if sampling_params is None or isinstance(sampling_params, (list, tuple)):
        raise UnsupportedVersion("TRL's colocated generate no longer passes one SamplingParams")
    if sampling_params.structured_outputs is not None:
        raise PipelineError(
            "grpo.constrained and TRL's own structured outputs (vllm_structured_outputs_regex, "
            "generation_kwargs['structured_outputs']) cannot both hold the rollouts"
        )
    out = []
    for grammar in grammars:
        if grammar is None:
            out.append(sampling_params)
            continue
        params = sampling_params.clone()
        params.structured_outputs = StructuredOutputsParams(grammar=grammar)
        out.append(params)
    return out


def _log_metrics(trainer, values: dict[str, float]) -> None:
    """Scalars into TRL's log beside its own: `_log_metric`, what TRL hands reward functions
    as `log_metric` (averaged over processes and logging steps)."""
    for key, value in values.items():
        trainer._log_metric(key, value)


@contextmanager
def vllm_generation_wrapped(wrappers: dict):
    """For the block: each method of TRL's VLLMGeneration (trl/generation/vllm_generation.py,
    the engine GRPOTrainer builds and drives: `_init_vllm`, `sync_weights`, `generate`) named in
    `wrappers` is replaced, on the class, by wrappers[name](TRL's own method); then restored."""
    require_written_for("trl")
    from trl.generation.vllm_generation import VLLMGeneration

    own = {name: getattr(VLLMGeneration, name) for name in wrappers}
    for name, wrap in wrappers.items():
        setattr(VLLMGeneration, name, wrap(own[name]))
    try:
        yield
    finally:
        for name, method in own.items():
            setattr(VLLMGeneration, name, method)


@contextmanager
def instance_attribute(obj, name: str, value):
    """obj.name = value for the block; then what it was (the class's attribute, or the
    instance's own): how every patch here is scoped (and sqlrl.model.generate's
    shared_prompt_prefill)."""
    own = vars(obj).get(name, _ABSENT)
    setattr(obj, name, value)
    try:
        yield
    finally:
        if own is _ABSENT:
            delattr(obj, name)
        else:
            setattr(obj, name, own)


_ABSENT = object()


def left_padded_position_ids(attention_mask):
    """The position ids transformers 5.17's generate gives a left-padded batch
    (GenerationMixin._prepare_position_ids_for_generation): count real tokens from 0, 0 on
    padding. A KV cache prefilled with these matches the one generate would compute."""
    require_written_for("transformers")
    return (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 0)


@contextmanager
def vllm_cpu_keeps_linear_weights():
    """For the block (building a colocated vLLM engine): on vLLM's CPU build, every unquantized
    linear layer keeps its `weight` as loaded. vLLM 0.32's
    `UnquantizedLinearMethod.process_weights_after_loading` otherwise prepacks the weight for
    oneDNN (or sgl-kernel) and replaces it with an empty parameter, so the next
    `model.load_weights` (TRL's weight sync after every step) fails with "'Parameter' object
    has no attribute 'weight_loader'". The layer then multiplies with torch's F.linear on the
    live weight: the flag vLLM sets for MLA's kv_b_proj (`_cpu_skip_gemm_dispatch`), set on
    every layer. A GPU build, or no vLLM, is left untouched."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        yield
        return
    if not current_platform.is_cpu():
        yield
        return
    require_written_for("vllm")
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    own = UnquantizedLinearMethod.process_weights_after_loading

    @functools.wraps(own)
    def keep_weights(self, layer):
        layer._cpu_skip_gemm_dispatch = True
        return own(self, layer)

    UnquantizedLinearMethod.process_weights_after_loading = keep_weights
    try:
        yield
    finally:
        UnquantizedLinearMethod.process_weights_after_loading = own


@contextmanager
def per_turn_completion_budget(trainer):
    """For the block: each turn after a tool result asks the generator for what is left of
    max_completion_length, not all of it. TRL 1.16's `_tool_call_loop` calls
    `_generate_single_turn` per turn, which asks for max_completion_length new tokens
    (`generation_config.max_new_tokens`, vLLM's `max_tokens`), and only afterwards trims the
    turn to what the episode has left: a turn that does not stop generated up to the whole
    budget again to keep a part of it. A turn is one call for its batch, so it asks the most any
    of its samples has left; TRL still trims each sample to its own, as before (tested through
    the trainer: tests/train/test_grpo_agent.py on transformers, tests/train/test_agent_budget.py
    on vLLM).

    Only where a call generates for this process's prompts alone (transformers, a colocated
    engine without tensor parallelism, one process): a shared engine generates for prompts
    whose budgets this process does not know, and keeps TRL's whole-budget ask."""
    require_written_for("trl")
    loop_name, turn_name = "_tool_call_loop", "_generate_single_turn"
    own_loop, own_turn = getattr(trainer, loop_name, None), getattr(trainer, turn_name, None)
    if own_loop is None or own_turn is None:
        raise UnsupportedVersion(f"{type(trainer).__name__} has no {loop_name}/{turn_name}")
    if not trainer.use_vllm:
        holder, field = trainer.generation_config, "max_new_tokens"
    elif trainer.accelerator.num_processes == 1 or (
        trainer.vllm_generation.mode == "colocate"
        and trainer.vllm_generation.tensor_parallel_size == 1
    ):
        holder, field = trainer.vllm_generation, "max_completion_length"
    else:
        yield
        return
    loop_prompts = []  # the prompt ids of the running loop, for its turns

    @functools.wraps(own_loop)
    def loop(prompts, prompt_ids, *args, **kwargs):
        loop_prompts.append(prompt_ids)
        try:
            return own_loop(prompts, prompt_ids, *args, **kwargs)
        finally:
            loop_prompts.pop()

    @functools.wraps(own_turn)
    def turn(sequences, *args, **kwargs):
        if not loop_prompts:  # the first turn: the whole budget is left
            return own_turn(sequences, *args, **kwargs)
        left = _budget_left(sequences, loop_prompts[-1], trainer.max_completion_length)
        with instance_attribute(holder, field, left):
            return own_turn(sequences, *args, **kwargs)

    with (
        instance_attribute(trainer, loop_name, loop),
        instance_attribute(trainer, turn_name, turn),
    ):
        yield


def _budget_left(sequences, prompt_ids, budget: int) -> int:
    """The most completion tokens any of `sequences` (a prompt, then what the episode has
    generated and the tool results) may still add, at least 1 (a generator asks for one or
    more). A sequence's prompt is the longest of `prompt_ids` it starts with: were two to
    match, the longer leaves more, so no sample is asked for less than it has left; one that
    matches none is left the whole budget."""
    known = {tuple(ids) for ids in prompt_ids}
    lengths = sorted({len(ids) for ids in prompt_ids}, reverse=True)

    def used(sequence) -> int:
        prompt = next((n for n in lengths if tuple(sequence[:n]) in known), len(sequence))
        return len(sequence) - prompt

    return max(1, budget - min(used(s) for s in sequences))
