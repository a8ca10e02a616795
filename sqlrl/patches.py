"""Every place the pipeline reaches into TRL's or transformers' internals, in one module.

Each patch was written against, and is tested on, the versions in WRITTEN_FOR (the pins of
requirements.txt). A private name can change or vanish in any release, so each one first
checks the installed version and fails loudly, naming it, on one it was not written for:
check the patch against the new source, then add the version here. Each patch is scoped: it
touches only the object it must and is undone when its `with` block ends.

- completion_logits_only_on_cpu: TRL scores only completion tokens on a Triton device but
  every position elsewhere; on a CPU the vocabulary-sized head over the prompt dominates a step.
- shared_prompt_prefill: TRL's transformers rollouts hold each prompt num_generations times in
  a row; run each prompt once and copy its KV cache to the repeats.
- timed_rollouts: the seconds GRPO spends generating and scoring (no public hook times it).
- left_padded_position_ids: the position ids transformers gives a left-padded prompt, so a
  KV cache computed outside `generate` holds the keys `generate` would compute.
"""

from __future__ import annotations

import functools
import importlib.metadata
import time
from contextlib import contextmanager

from sqlrl.errors import PipelineError

WRITTEN_FOR = {"trl": ("1.16",), "transformers": ("5.17",)}  # major.minor releases checked


class UnsupportedVersion(PipelineError, RuntimeError):
    """A patch meets a TRL or transformers release it was not written for."""


def require_written_for(package: str) -> str:
    """The installed version of `package`, when a release the patches were written for."""
    version = importlib.metadata.version(package)
    if ".".join(version.split(".")[:2]) not in WRITTEN_FOR[package]:
        raise UnsupportedVersion(
            f"sqlrl/patches.py was written for {package} "
            f"{' or '.join(v + '.x' for v in WRITTEN_FOR[package])}, but {package} {version} is "
            f"installed: install the version requirements.txt pins, or check each patch in "
            f"sqlrl/patches.py against {package} {version} and add it to WRITTEN_FOR"
        )
    return version


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
def shared_prompt_prefill(model):
    """For the block: `model.generate` (what TRL's transformers rollouts call) runs each
    repeated prompt once and copies its KV cache to the repeats
    (sqlrl.model.generate.shared_prefix_generate): the same samples for ~1/num_generations of
    the prompt compute. Calls without a prompt batch go to the model's own generate."""
    require_written_for("transformers")
    from sqlrl.model.generate import shared_prefix_generate

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

    with _instance_attribute(model, "generate", generate):
        yield


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

    with _instance_attribute(trainer, name, timed):
        yield


@contextmanager
def _instance_attribute(obj, name: str, value):
    """obj.name = value for the block; then what it was (the class's attribute, or the
    instance's own)."""
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
