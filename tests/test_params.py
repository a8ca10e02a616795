"""The typed params loader and the Hydra profile composition."""

from __future__ import annotations

import pytest
import yaml

from sqlrl.params import (
    ParamsError,
    compose_params,
    composed_yaml,
    load_params,
    params_from_dict,
)
from tests.repo_tools import REPO_ROOT

PROFILES = ["cpu", "smoke", "qwen2.5-coder-3b"]


def test_committed_params_yaml_is_the_composed_default_profile():
    assert (REPO_ROOT / "params.yaml").read_text() == composed_yaml(), (
        "params.yaml is stale: recompose it with `python -m sqlrl.params > params.yaml`"
    )
    assert load_params().profile == "cpu"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_composes_into_valid_params(profile):
    params = params_from_dict(compose_params(profile))
    assert params.profile == profile


def test_reference_profile_is_the_qwen_gpu_run():
    """What makes it the reference: the hub model at a pinned commit, LoRA, vLLM rollouts,
    bf16 (the tuned values live in the YAML and docs/experiments.md, not here)."""
    p = params_from_dict(compose_params("qwen2.5-coder-3b"))
    assert (p.base.source, p.base.model_id) == ("hub", "Qwen/Qwen2.5-Coder-3B-Instruct")
    assert len(p.base.revision) == 40  # a pinned commit, not a branch
    assert p.sft.use_lora and p.grpo.use_vllm and p.sft.bf16 is True and p.grpo.bf16 is True


def test_reference_grpo_sees_many_questions_per_step_with_the_filter_on():
    """One optimizer step must average over many questions, not one group (issue 16)."""
    g = params_from_dict(compose_params("qwen2.5-coder-3b")).grpo
    assert g.prompts_per_step() >= 8
    assert g.pass_rate_filter.pool > 0 and g.pass_rate_filter.min_rate > 0


def test_rehearsal_profile_keeps_the_reference_settings_a_cpu_can_run():
    ref = params_from_dict(compose_params("qwen2.5-coder-3b"))
    reh = params_from_dict(compose_params("qwen-rehearsal"))
    assert (reh.base.source, reh.base.tokenizer, reh.base.dtype) == (
        "scratch",
        "qwen2.5",
        "bfloat16",
    )
    for section in ("prepare", "sft", "grpo"):
        a, b = getattr(ref, section), getattr(reh, section)
        same = [
            k
            for k in (
                "schema_format",
                "sample_rows",
                "max_prompt_tokens",
                "max_length",
                "use_lora",
                "lora",
                "batch_size",
                "grad_accum",
                "temperature",
                "executable_credit",
                "gradient_checkpointing",
                "learning_rate",
                "loss_type",
                "beta",
                "epsilon",
                "epsilon_high",
                "scale_rewards",
                "reward_weights",
                "drop_empty_gold",
            )
            if hasattr(a, k) and not (section == "grpo" and k == "grad_accum")
        ]
        assert [getattr(a, k) for k in same] == [getattr(b, k) for k in same], section
    assert not (reh.sft.bf16 or reh.grpo.bf16 or reh.grpo.use_vllm)
    assert reh.grpo.prompts_per_step() >= 8  # GRPO's completions are cut for the CPU only


@pytest.mark.parametrize("profile", PROFILES + ["qwen-rehearsal"])
def test_every_profile_sets_precision_and_checkpointing_itself(profile):
    """TRL defaults bf16=True and gradient_checkpointing=True: a profile that inherits them
    from conf/config.yaml runs bf16 autocast (33x slower on an AVX2 CPU) or recomputes
    activations without meaning to. Each sets both, in its YAML or a profile it extends."""
    conf = (REPO_ROOT / "params.yaml").parent / "conf" / "profile"
    chain, todo = [], [profile]
    while todo:
        data = yaml.safe_load((conf / f"{todo.pop()}.yaml").read_text())
        chain.append(data)
        todo += [d for d in data.get("defaults", []) if isinstance(d, str)]
    for section in ("sft", "grpo"):
        for key in ("bf16", "gradient_checkpointing"):
            assert any(key in data.get(section, {}) for data in chain), (
                f"{profile}: {section}.{key}"
            )


def test_the_cpu_default_trains_in_fp32_unless_bf16_is_fast_and_uses_its_cores():
    p = params_from_dict(compose_params("cpu"))
    assert (p.sft.bf16, p.grpo.bf16) == ("auto", "auto")
    assert p.torch_threads == 0


@pytest.mark.parametrize("value", ["fast", 1, None])
def test_a_bf16_setting_other_than_true_false_auto_is_refused(value):
    data = compose_params("cpu")
    data["sft"]["bf16"] = value
    with pytest.raises(ParamsError, match="sft.bf16"):
        params_from_dict(data)


def test_schema_grounding_is_off_in_the_reference_profile():
    p = params_from_dict(compose_params("qwen2.5-coder-3b"))
    assert p.prepare.augment.copies == 0 and not p.prepare.mark_schema_mentions


def test_overrides_compose_like_dvc_exp_run_set_param():
    assert compose_params(overrides=["grpo.steps=500"])["grpo"]["steps"] == 500
    assert (
        compose_params("smoke", ["prepare.schema_format=ddl"])["prepare"]["schema_format"] == "ddl"
    )


def _params_dict():
    return yaml.safe_load((REPO_ROOT / "params.yaml").read_text())


def test_unknown_key_is_named():
    data = _params_dict()
    data["sft"]["learning_rat"] = 1.0
    with pytest.raises(ParamsError, match=r"unknown key\(s\) sft.learning_rat"):
        params_from_dict(data)


def test_missing_key_is_named():
    data = _params_dict()
    del data["grpo"]["lora"]["alpha"]
    with pytest.raises(ParamsError, match=r"missing key\(s\) grpo.lora.alpha"):
        params_from_dict(data)


def test_wrong_type_is_named():
    data = _params_dict()
    data["grpo"]["steps"] = "many"
    with pytest.raises(ParamsError, match="grpo.steps: expected int, got 'many'"):
        params_from_dict(data)
    data = _params_dict()
    data["sft"]["use_lora"] = 1
    with pytest.raises(ParamsError, match="sft.use_lora: expected bool"):
        params_from_dict(data)


def test_ints_are_accepted_for_floats():
    data = _params_dict()
    data["sft"]["learning_rate"] = 1
    assert params_from_dict(data).sft.learning_rate == 1.0


def test_bad_values_are_refused():
    data = _params_dict()
    data["prepare"]["schema_format"] = "xml"
    with pytest.raises(ParamsError, match="schema_format must be one of"):
        params_from_dict(data)
    data = _params_dict()
    data["prepare"]["heldout_fraction"] = 1.5
    with pytest.raises(ParamsError, match="heldout_fraction"):
        params_from_dict(data)


def test_load_params_names_the_file(tmp_path):
    bad = tmp_path / "params.yaml"
    bad.write_text("seed: [unclosed")
    with pytest.raises(ParamsError, match=str(bad)):
        load_params(bad)
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "absent.yaml")
