"""The typed params loader and the Hydra profile composition."""

from __future__ import annotations

import re
from pathlib import Path

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

# every profile there is: a new conf/profile/*.yaml is tested without being listed here
PROFILES = sorted(path.stem for path in (REPO_ROOT / "conf" / "profile").glob("*.yaml"))


def test_profiles_are_read_from_conf():
    """An empty or wrong glob would parametrize the profile tests over nothing and pass."""
    assert {"cpu", "smoke", "qwen2.5-coder-3b", "qwen-rehearsal"} <= set(PROFILES)


def test_committed_params_yaml_is_the_composed_default_profile():
    assert (REPO_ROOT / "params.yaml").read_text() == composed_yaml(), (
        "params.yaml is stale: recompose it with `python -m sqlrl.params > params.yaml`"
    )
    assert load_params().profile == "cpu"


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_composes_into_valid_params(profile):
    params = params_from_dict(compose_params(profile))
    assert params.profile == profile


@pytest.mark.parametrize("profile", PROFILES)
def test_a_hub_model_is_pinned_to_a_commit(profile):
    """A branch name would let the base model change under the same params (the run would
    no longer reproduce); a scratch model has nothing to pin."""
    base = params_from_dict(compose_params(profile)).base
    if base.source == "hub":
        assert re.fullmatch(r"[0-9a-f]{40}", base.revision), base.revision


def test_reference_grpo_sees_many_questions_per_step_with_the_filter_on():
    """One optimizer step must average over many questions, not one group (issue 16)."""
    g = params_from_dict(compose_params("qwen2.5-coder-3b")).grpo
    assert g.prompts_per_step >= 8
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
                "rows_per_step",
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
            if hasattr(a, k)
        ]
        assert [getattr(a, k) for k in same] == [getattr(b, k) for k in same], section
    assert not (reh.sft.bf16 or reh.grpo.bf16 or reh.grpo.use_vllm)
    assert reh.grpo.prompts_per_step >= 8  # GRPO's completions are cut for the CPU only


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_sets_precision_and_checkpointing_itself(profile):
    """TRL defaults bf16=True and gradient_checkpointing=True: a profile that inherits them
    from conf/config.yaml runs bf16 autocast (33x slower on an AVX2 CPU) or recomputes
    activations without meaning to. Each sets both, in its YAML or a profile it extends."""
    chain = _profile_chain(profile)
    for section in ("sft", "grpo"):
        for key in ("bf16", "gradient_checkpointing"):
            assert any(key in data.get(section, {}) for data in chain), (
                f"{profile}: {section}.{key}"
            )


@pytest.mark.parametrize("value", ["fast", 1, None])
def test_a_bf16_setting_other_than_true_false_auto_is_refused(value):
    data = compose_params("cpu")
    data["sft"]["bf16"] = value
    with pytest.raises(ParamsError, match="sft.bf16"):
        params_from_dict(data)


def _yaml(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _profile_chain(profile: str) -> list[dict]:
    """A profile's YAML and the profiles it extends (its `defaults`), the parents first."""
    data = _yaml(REPO_ROOT / "conf" / "profile" / f"{profile}.yaml")
    parents = [d for d in data.get("defaults", []) if isinstance(d, str)]
    return [ancestor for parent in parents for ancestor in _profile_chain(parent)] + [data]


def _leaves(data: dict, prefix: str = "") -> dict:
    """{dotted key: value} of nested mappings, without Hydra's `defaults` lists."""
    leaves = {}
    for key, value in data.items():
        if key == "defaults" and not prefix:
            continue
        if isinstance(value, dict):
            leaves.update(_leaves(value, f"{prefix}{key}."))
        else:
            leaves[f"{prefix}{key}"] = value
    return leaves


@pytest.mark.parametrize("profile", PROFILES)
def test_a_profile_overrides_config_yaml_key_by_key_over_the_profile_it_extends(profile):
    """What a profile sets wins over the profile it extends, which wins over conf/config.yaml;
    every key it leaves alone keeps that default, also inside a section it changes."""
    expected = _leaves(_yaml(REPO_ROOT / "conf" / "config.yaml"))
    for data in _profile_chain(profile):
        expected.update(_leaves(data))
    # an interpolation (grpo.seed: ${seed}) composes to the value of the key it names
    expected = {
        key: expected[value[2:-1]] if str(value).startswith("${") else value
        for key, value in expected.items()
    }
    assert _leaves(compose_params(profile)) == expected


def test_grpo_seed_follows_seed_unless_set_itself():
    """grpo.seed defaults to `seed` (a run that changes `seed` reseeds GRPO too, as before it
    had its own); set alone, it leaves `seed`, and so the data and SFT model, as they were."""
    assert compose_params("cpu")["grpo"]["seed"] == 42
    assert compose_params("cpu", ["seed=7"])["grpo"]["seed"] == 7
    alone = compose_params("cpu", ["grpo.seed=43"])
    assert (alone["seed"], alone["grpo"]["seed"]) == (42, 43)


def test_overrides_compose_like_dvc_exp_run_set_param_over_the_profile():
    smoke = compose_params("smoke")
    steps = smoke["grpo"]["steps"] + 1
    assert compose_params("smoke", [f"grpo.steps={steps}"])["grpo"]["steps"] == steps
    other = "ddl" if smoke["prepare"]["schema_format"] == "compact" else "compact"
    overridden = compose_params("smoke", [f"prepare.schema_format={other}"])
    assert overridden["prepare"]["schema_format"] == other


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["grpo.num_generations=4", "grpo.batch_size=6"],
            r"grpo.batch_size \(6\) must be a multiple of grpo.num_generations \(4\)",
        ),
        (["grpo.scale_rewards=sometimes"], "grpo.scale_rewards: Input should be 'group', 'batch'"),
        (["grpo.prompts_per_step=0"], "grpo.prompts_per_step: Input should be greater than or"),
        (
            ["sft.rows_per_step=12"],
            r"sft.rows_per_step \(12\) over 1 process\(es\) .* batch_size 8",
        ),
        (["grpo.top_p=0"], r"grpo.top_p: Input should be greater than 0 \(got 0\)"),
        (
            ["grpo.vllm_gpu_memory_utilization=1.0"],
            "grpo.vllm_gpu_memory_utilization: .* less than 1",
        ),
        (["grpo.executable_credit=1.0"], r"grpo.executable_credit: .* less than 1 \(got 1.0\)"),
        (["grpo.vllm_server_port=70000"], "grpo.vllm_server_port: .* less than or equal to 65535"),
        (["grpo.num_generations=1", "grpo.batch_size=16"], "grpo.num_generations: .* equal to 2"),
        (["eval.num_samples=4", "eval.temperature=0"], "eval.temperature must be > 0"),
        (["eval.batch_size=0"], r"eval.batch_size: Input should be greater than or equal to 1"),
        (["sft.warmup_ratio=1.0"], r"sft.warmup_ratio: Input should be less than 1 \(got 1.0\)"),
        (
            ["prepare.augment.rename_prob=2"],
            r"prepare.augment.rename_prob: .* less than or equal to 1",
        ),
        (["prepare.augment.copies=-1"], "prepare.augment.copies: .* greater than or equal to 0"),
        (
            ["prepare.max_dev_examples=-1"],
            "prepare.max_dev_examples: .* greater than or equal to 0",
        ),
        (
            ["base.source=cloud"],
            "base.source: Input should be 'hub' or 'scratch' \\(got 'cloud'\\)",
        ),
        (["base.dtype=int8"], "base.dtype: Input should be 'float32', 'bfloat16' or 'float16'"),
        (
            ["base.tokenizer=gpt2"],
            "base.tokenizer: Input should be 'trained', 'trained-tools' or 'qwen2.5'",
        ),
        (["sft.prompt_loss_weight=0"], "sft.prompt_loss_weight: Input should be greater than 0"),
        (["sft.prompt_loss_weight=1.5"], "sft.prompt_loss_weight: Input should be less than or"),
        (["sft.prompt_loss_sample=0"], "sft.prompt_loss_sample: Input should be greater than 0"),
    ],
)
def test_a_run_override_that_makes_no_sense_is_refused_naming_the_key(overrides, message):
    """`dvc exp run -S ...` composes whatever it is given: loading the params refuses it
    before any stage runs, naming the key."""
    with pytest.raises(ParamsError, match=message):
        params_from_dict(compose_params("smoke", overrides))


def _params_dict():
    from tests.repo_tools import fixed_params_dict

    return fixed_params_dict()


def test_unknown_key_is_named():
    data = _params_dict()
    data["sft"]["learning_rat"] = 1.0
    with pytest.raises(ParamsError, match=r"unknown key sft.learning_rat"):
        params_from_dict(data)


def test_missing_key_is_named():
    data = _params_dict()
    del data["grpo"]["lora"]["alpha"]
    with pytest.raises(ParamsError, match=r"missing key grpo.lora.alpha"):
        params_from_dict(data)


def test_wrong_type_is_named():
    data = _params_dict()
    data["grpo"]["steps"] = "many"
    with pytest.raises(
        ParamsError, match=r"grpo.steps: Input should be a valid integer \(got 'many'\)"
    ):
        params_from_dict(data)
    data = _params_dict()
    data["sft"]["use_lora"] = 1
    with pytest.raises(
        ParamsError, match=r"sft.use_lora: Input should be a valid boolean \(got 1\)"
    ):
        params_from_dict(data)


def test_ints_are_accepted_for_floats():
    data = _params_dict()
    data["sft"]["learning_rate"] = 1
    assert params_from_dict(data).sft.learning_rate == 1.0


def test_bad_values_are_refused():
    data = _params_dict()
    data["prepare"]["schema_format"] = "xml"
    with pytest.raises(ParamsError, match="prepare.schema_format: Input should be 'compact' or"):
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
    data = _params_dict()
    data["grpo"]["stepz"] = 3
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ParamsError, match=rf"{re.escape(str(bad))}: unknown key grpo.stepz"):
        load_params(bad)


def test_a_vllm_context_shorter_than_the_longest_prompt_and_completion_is_refused():
    """vLLM refuses a prompt past its context mid-run: the reference's params say so first."""
    with pytest.raises(ParamsError, match=r"grpo.vllm_max_model_length \(2200\) is less than"):
        params_from_dict(compose_params("qwen2.5-coder-3b", ["grpo.vllm_max_model_length=2200"]))


def test_every_setting_in_config_yaml_comes_with_its_advice():
    """Each setting is documented once, next to its default (sqlrl/params.py holds only types
    and ranges): a comment on its line, on the line above it, or on its section's line when
    the section groups settings that need no word each (a LoRA, an architecture)."""
    lines = (REPO_ROOT / "conf" / "config.yaml").read_text().splitlines()
    undocumented = []
    section_comment = {}
    for i, line in enumerate(lines):
        match = re.match(r"( *)([a-z_0-9]+):(.*)", line)
        if not match or line.startswith("defaults"):
            continue
        indent, key, rest = len(match[1]), match[2], match[3]
        value = rest.split("#")[0].strip()
        section_comment[indent] = "#" in rest
        if not value:  # a section header
            continue
        documented = (
            "#" in rest
            or lines[i - 1].strip().startswith("#")
            or any(section_comment.get(level) for level in range(0, indent, 2))
            or (value.startswith(">") and lines[i - 1].strip().startswith("#"))
        )
        if not documented:
            undocumented.append(key)
    assert not undocumented, f"settings without advice in conf/config.yaml: {undocumented}"


def test_an_override_of_a_key_the_config_lacks_is_one_line_naming_it():
    with pytest.raises(ParamsError, match="Could not override 'grpo.stepz'"):
        compose_params("smoke", ["grpo.stepz=1"])


def test_the_agent_rollout_on_a_tokenizer_without_tool_calling_is_refused():
    """The trained tokenizer's ChatML has no tools branch: TRL would refuse it only after the
    model loads. With Qwen2.5's tokenizer the same run composes."""
    with pytest.raises(ParamsError, match="grpo.rollout agent needs a chat template"):
        params_from_dict(compose_params("smoke", ["grpo.rollout=agent"]))
    params = params_from_dict(
        compose_params("smoke", ["grpo.rollout=agent", "base.tokenizer=qwen2.5"])
    )
    assert (params.grpo.rollout, params.grpo.agent.max_turns) == ("agent", 5)
    small = params_from_dict(compose_params("smoke-agent", []))  # the trained vocabulary's
    assert (small.base.tokenizer, small.grpo.rollout) == ("trained-tools", "agent")


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["grpo.vllm_mode=server"], "grpo.vllm_mode server gathers"),
        (["grpo.vllm_tensor_parallel_size=2"], "grpo.vllm_tensor_parallel_size 2 gathers"),
    ],
)
def test_agent_rollouts_whose_vllm_turns_are_collectives_are_refused_on_several_processes(
    overrides, why
):
    """TRL's tool loop runs a different number of turns on each process; a vLLM generation
    every process must join then hangs the run. Refused when the params load, saying what
    to change; one process, or colocate with tensor parallel 1, composes."""
    agent = ["launch.num_processes=4", *overrides]
    with pytest.raises(ParamsError, match="would hang under launch.num_processes 4") as refused:
        params_from_dict(compose_params("qwen2.5-coder-3b-agent", agent))
    assert why in str(refused.value)
    assert "grpo.vllm_mode colocate with grpo.vllm_tensor_parallel_size 1" in str(refused.value)
    for fine in (
        ["launch.num_processes=1", *overrides],  # one process: its turns are everyone's
        ["launch.num_processes=4"],  # colocate, one engine per process: no collective
        [*agent, "grpo.use_vllm=false"],  # transformers generates on each process alone
        [*agent, "grpo.rollout=sql"],  # one generation per step, the same on every process
    ):
        params_from_dict(compose_params("qwen2.5-coder-3b-agent", fine))
