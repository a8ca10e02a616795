"""The one typed loader and validator for params.yaml.

params.yaml is composed by DVC's Hydra support from conf/ (conf/config.yaml + a `profile`).
conf/config.yaml holds every setting's default and its one line of advice; these pydantic
dataclasses hold only names, types and allowed ranges, checked by one validator when the
params load, so a typo, a missing key or a value out of range fails at load time with the
key's full name, not deep inside a training loop. A check that needs two settings at once
is a `__post_init__` of the section that holds both.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    PlainValidator,
    StrictInt,
    StrictStr,
    TypeAdapter,
    ValidationError,
)
from pydantic import StrictBool as Bool
from pydantic.dataclasses import dataclass

from sqlrl.errors import PipelineError
from sqlrl.reward_names import REWARDS as BUILTIN_REWARDS  # the rewards' one registry

SCHEMA_FORMATS = ("compact", "ddl")
DTYPES = ("float32", "bfloat16", "float16")
TOKENIZERS = ("trained", "trained-tools", "qwen2.5")
VLLM_MODES = ("colocate", "server")
# eval.sets' benchmark families: sqlrl.benchmarks' built-in names, declared here so that
# params (read by every stage) does not make every stage depend on the benchmark code;
# tests/benchmarks/test_registry.py checks them against the registry
BENCHMARK_FORMATS = ("spider", "bird")
SET_NAME = r"^[a-z][a-z0-9_]*$"  # a metrics section and a file name
RESERVED_SET_NAMES = {"dev", "heldout", "generation"}
# grpo.rollout's answer formats: sqlrl.formats' built-in names (declared here, so params stays
# light; tests/formats/test_registry.py checks them against the registry), and those whose rollouts
# call tools (their Format's `calls_tools`)
ROLLOUTS = ("sql", "reasoning", "agent")
TOOL_ROLLOUTS = ("agent",)
# the formats whose answer can be decoded under sqlrl/sql/grammar.py's grammar
# (eval.constrained, grpo.constrained: the query, or reasoning's answer span); their Format's
# `grammar_constrained`, checked by tests/eval/test_constrained.py
CONSTRAINED_ROLLOUTS = ("sql", "reasoning")
REWARD_IMPORT = r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*:[A-Za-z_][\w]*$"  # package.module:function


class ParamsError(PipelineError, ValueError):
    """params.yaml does not match what the pipeline expects."""


def parse_bool(raw: str) -> bool:
    """A boolean as environment variables spell it: 1/true/yes/on or 0/false/no/off."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {raw!r}")


def _bf16_setting(value: Any) -> bool | str:
    if value is True or value is False or value == "auto":
        return value
    raise ValueError("must be true, false or auto")


# YAML already gives typed values: nothing is coerced (no "3" for 3, no 1 for true), but an
# int is a valid float.
Str = StrictStr
Int = StrictInt
Count = Annotated[StrictInt, Field(ge=0)]  # 0 allowed: usually "off" or "all"
Positive = Annotated[StrictInt, Field(ge=1)]
NonNegative = Annotated[float, Field(strict=True, ge=0)]
Share = Annotated[float, Field(strict=True, ge=0, le=1)]  # [0, 1]
ShareBelowOne = Annotated[float, Field(strict=True, ge=0, lt=1)]  # [0, 1)
Rate = Annotated[float, Field(strict=True, gt=0)]  # > 0
Bf16 = Annotated[Any, PlainValidator(_bf16_setting)]  # true | false | "auto"

SECTION = ConfigDict(extra="forbid", frozen=True)


def check_sampling(
    n: int, temperature: float, n_name: str = "n", t_name: str = "temperature"
) -> None:
    """The one rule for asking a model for several answers, checked here by params
    (eval.num_samples), the generators, the server and TextToSQL: n > 1 needs a temperature
    > 0, as greedy decoding gives the same answer every time. `n_name` and `t_name` are the
    names the caller's user knows the two by."""
    if n > 1 and not temperature > 0.0:
        raise ParamsError(
            f"{t_name} must be > 0 when {n_name} > 1: greedy decoding gives one answer "
            f"(got {temperature})"
        )


def split_per_process(total: int, batch_size: int, world: int, what: str) -> tuple[int, int]:
    """(rows per pass per process, passes per optimizer step) that make one optimizer step see
    `total` rows in all over `world` processes. The recipe fixes the step's size; the machine
    only decides how it is split, so 1, 4 or 8 GPUs train on the same data per step. The pass
    is batch_size rows, or fewer when the step's share per process is smaller than that."""
    if total < 1 or batch_size < 1:
        raise ParamsError(f"{what} and its batch_size must be >= 1, got {total} and {batch_size}")
    if total % world:
        raise ParamsError(f"{what} ({total}) must be divisible by the {world} training processes")
    per_process = total // world
    batch = min(batch_size, per_process)
    if per_process % batch:
        raise ParamsError(
            f"{what} ({total}) over {world} process(es) is {per_process} rows per process: "
            f"not a multiple of batch_size {batch}; change one of them"
        )
    return batch, per_process // batch


# Each section mirrors one mapping of conf/config.yaml, where each setting is explained.


@dataclass(config=SECTION)
class AugmentParams:
    copies: NonNegative
    shuffle_schema: Bool
    rename_prob: Share


@dataclass(config=SECTION)
class EvalSetParams:
    """One benchmark-format set (sqlrl/benchmarks/sets.py): an evaluation set beside Spider
    dev and held-out (eval.sets), or a training set (prepare.extra_train_sets)."""

    format: Literal[BENCHMARK_FORMATS]
    questions: Str  # paths relative to the stages' --raw folder (data/raw/)
    tables: Str
    databases: Annotated[list[Str], Field(min_length=1)]  # searched in order for db_id/db_id.sqlite
    question_key: Str = ""  # "" = the format's own (Spider-Syn asks `SpiderSynQuestion`)

    def __post_init__(self):
        for path in (self.questions, self.tables, *self.databases):
            if Path(path).is_absolute() or ".." in Path(path).parts:
                raise ValueError(f"{path!r} must be relative to data/raw/, without '..'")


@dataclass(config=SECTION)
class PrepareParams:
    schema_format: Literal[SCHEMA_FORMATS]
    sample_rows: Count
    include_train_others: Bool
    heldout_fraction: ShareBelowOne
    rl_only_fraction: ShareBelowOne
    max_train_examples: Count
    max_dev_examples: Count
    system_prompt: Str
    augment: AugmentParams
    mark_schema_mentions: Bool
    max_prompt_tokens: Count
    extra_train: list[Str]
    # a default only so that a params.yaml composed before this setting still loads (its
    # advice and the default DVC records are conf/config.yaml's)
    column_descriptions: Bool = False
    # more training sets in an evaluation set's shape (BIRD's train split); the same kind of
    # default, for the same reason
    extra_train_sets: dict[Annotated[StrictStr, Field(pattern=SET_NAME)], EvalSetParams] = (
        dataclasses.field(default_factory=dict)
    )

    def __post_init__(self):
        for name in self.extra_train:
            if Path(name).is_absolute() or ".." in Path(name).parts or not name.strip():
                raise ParamsError(
                    f"prepare.extra_train: {name!r} is not a file name inside the prepare "
                    "stage's --extra-train folder (data/feedback/ in dvc.yaml)"
                )


@dataclass(config=SECTION)
class ArchitectureParams:
    hidden_size: Positive
    intermediate_size: Positive
    num_hidden_layers: Positive
    num_attention_heads: Positive
    num_key_value_heads: Positive
    max_position_embeddings: Positive
    vocab_size: Positive


@dataclass(config=SECTION)
class BaseParams:
    source: Literal["hub", "scratch"]
    model_id: Str
    revision: Str
    dtype: Literal[DTYPES]
    tokenizer: Literal[TOKENIZERS]
    architecture: ArchitectureParams


@dataclass(config=SECTION)
class LoraParams:
    r: Positive
    alpha: Positive
    dropout: ShareBelowOne
    target_modules: list[Str]


@dataclass(config=SECTION)
class SftParams:
    use_lora: Bool
    lora: LoraParams
    epochs: Rate
    learning_rate: Rate
    batch_size: Positive
    rows_per_step: Positive
    max_length: Positive
    bf16: Bf16
    gradient_checkpointing: Bool
    lr_scheduler: Str
    warmup_ratio: ShareBelowOne
    weight_decay: NonNegative
    group_by_length: Bool
    attn_implementation: Str
    logging_steps: Positive
    completion_only_loss: Bool
    # (0, 1]: no prompt loss at all is completion_only_loss: true
    prompt_loss_weight: Annotated[float, Field(strict=True, gt=0, le=1)]
    prompt_loss_sample: Annotated[float, Field(strict=True, gt=0, le=1)]
    save_steps: Count
    resume: Bool

    def __post_init__(self):
        self.per_process(1)

    def per_process(self, world_size: int = 1) -> tuple[int, int]:
        """(rows per pass, passes per optimizer step) for each of world_size processes."""
        return split_per_process(
            self.rows_per_step, self.batch_size, world_size, "sft.rows_per_step"
        )


def _reward_name(name: str) -> str:
    """A reward weight's key: a built-in reward's name, or a user's `package.module:function`
    (imported when the rewards are built, where an import error is one line naming it)."""
    import re

    if name in BUILTIN_REWARDS or re.match(REWARD_IMPORT, name):
        return name
    raise ValueError(
        f"unknown reward {name!r}: one of {', '.join(BUILTIN_REWARDS)}, or package.module:function"
    )


RewardName = Annotated[StrictStr, AfterValidator(_reward_name)]


@dataclass(config=SECTION)
class AgentParams:
    max_turns: Positive
    max_rows: Positive
    max_chars: Annotated[StrictInt, Field(ge=100)]  # room for the column names and an error


@dataclass(config=SECTION)
class PassRateFilter:
    pool: Count
    samples: Positive
    min_rate: Share
    max_rate: Share


@dataclass(config=SECTION)
class GrpoParams:
    seed: Int  # its own, so that a seed sweep of GRPO reuses one SFT model (docs/seeds.md)
    steps: Positive
    learning_rate: Rate
    batch_size: Positive
    prompts_per_step: Positive
    num_generations: Annotated[StrictInt, Field(ge=2)]  # a group of one has no advantage
    temperature: Rate
    top_p: Annotated[float, Field(strict=True, gt=0, le=1)]
    top_k: Count
    min_p: ShareBelowOne
    repetition_penalty: Rate
    max_completion_length: Positive
    loss_type: Str
    beta: NonNegative
    epsilon: NonNegative
    epsilon_high: NonNegative
    scale_rewards: Literal["group", "batch", "none"]
    num_iterations: Positive
    rollout: Literal[ROLLOUTS]
    agent: AgentParams
    # name -> weight, in the order TRL gets them; at least one reward
    reward_weights: Annotated[dict[RewardName, NonNegative], Field(min_length=1)]
    reward_timeout_s: Rate
    executable_credit: ShareBelowOne  # below a correct answer's 1.0
    schema_repair: Bool
    constrained: Bool  # rollouts under each prompt's database grammar (sqlrl/train/constrained.py)
    drop_empty_gold: Bool
    pass_rate_filter: PassRateFilter
    lora: LoraParams
    use_vllm: Bool
    vllm_mode: Literal[VLLM_MODES]
    vllm_gpu_memory_utilization: Annotated[float, Field(strict=True, gt=0, lt=1)]
    vllm_max_model_length: Positive
    vllm_enable_sleep_mode: Bool
    vllm_tensor_parallel_size: Positive
    # the vLLM server's settings are checked in every mode: a bad port fails the first stage
    # that reads params, not GRPO after hours of SFT
    vllm_server_host: Annotated[StrictStr, Field(min_length=1, pattern=r"\S")]
    vllm_server_port: Annotated[StrictInt, Field(ge=1, le=65535)]
    vllm_server_timeout_s: NonNegative
    bf16: Bf16
    gradient_checkpointing: Bool
    logging_steps: Positive
    save_steps: Positive
    resume: Bool

    def __post_init__(self):
        if self.batch_size % self.num_generations:
            raise ParamsError(
                f"grpo.batch_size ({self.batch_size}) must be a multiple of "
                f"grpo.num_generations ({self.num_generations})"
            )
        if self.vllm_max_model_length <= self.max_completion_length:
            raise ParamsError(
                f"grpo.vllm_max_model_length ({self.vllm_max_model_length}) must exceed "
                f"grpo.max_completion_length ({self.max_completion_length})"
            )
        self.per_process(1)

    def per_process(self, world_size: int = 1) -> tuple[int, int]:
        """(completions per pass, passes per optimizer step) for each of world_size processes:
        prompts_per_step questions x num_generations completions a step, whatever world_size."""
        return split_per_process(
            self.prompts_per_step * self.num_generations,
            self.batch_size,
            world_size,
            "grpo.prompts_per_step x grpo.num_generations",
        )


@dataclass(config=SECTION)
class EvalParams:
    batch_size: Positive
    max_new_tokens: Positive
    use_vllm: Bool
    num_samples: Positive
    temperature: NonNegative
    schema_repair: Bool
    constrained: Bool
    vote_models: list[Str]
    sets: dict[Annotated[StrictStr, Field(pattern=SET_NAME)], EvalSetParams]

    def __post_init__(self):
        check_sampling(self.num_samples, self.temperature, "eval.num_samples", "eval.temperature")
        taken = sorted(set(self.sets) & RESERVED_SET_NAMES)
        if taken:
            raise ParamsError(f"eval.sets: {taken} name the splits prepare writes; rename them")


@dataclass(config=SECTION)
class LaunchParams:
    num_processes: Positive
    config: Str

    def __post_init__(self):
        if self.config and not Path(self.config).is_file():  # relative: to the repo root
            raise ParamsError(f"launch.config: no file {self.config!r} (see conf/accelerate/)")


@dataclass(config=SECTION)
class Params:
    seed: Int
    profile: Str
    torch_threads: Count
    launch: LaunchParams
    prepare: PrepareParams
    base: BaseParams
    sft: SftParams
    grpo: GrpoParams
    eval: EvalParams

    def __post_init__(self):
        """What needs two sections: each step's split over launch.num_processes, a chat
        template with tools for the agent rollout, constrained evaluation only for the `sql`
        format (eval.constrained), agent rollouts whose vLLM generation is
        not a collective across processes, a vLLM context that holds the longest prompt
        prepare may write plus a completion, and no training set that is also an evaluation
        set."""
        world = self.launch.num_processes
        self.sft.per_process(world)
        self.grpo.per_process(world)
        self._check_agent_vllm(world)
        if self.eval.constrained and self.grpo.rollout not in CONSTRAINED_ROLLOUTS:
            raise ParamsError(
                f"eval.constrained covers the {'/'.join(CONSTRAINED_ROLLOUTS)} answer formats "
                f"only: grpo.rollout {self.grpo.rollout} calls a tool whose query argument "
                "the grammar does not reach (set eval.constrained=false; docs/grammar.md)"
            )
        if self.grpo.constrained and self.grpo.rollout not in CONSTRAINED_ROLLOUTS:
            raise ParamsError(
                f"grpo.constrained covers the {'/'.join(CONSTRAINED_ROLLOUTS)} answer formats "
                f"only: grpo.rollout {self.grpo.rollout} calls a tool whose query argument "
                "the grammar does not reach (set grpo.constrained=false; docs/grammar.md)"
            )
        self._check_constrained_vllm()
        if (
            self.grpo.rollout in TOOL_ROLLOUTS
            and self.base.source == "scratch"
            and self.base.tokenizer == "trained"
        ):
            raise ParamsError(
                "grpo.rollout agent needs a chat template that can call tools: the trained "
                "tokenizer's has none (set base.tokenizer=trained-tools or qwen2.5, or use a "
                "hub model)"
            )
        longest = self.prepare.max_prompt_tokens + self.grpo.max_completion_length
        if self.prepare.max_prompt_tokens and self.grpo.vllm_max_model_length < longest:
            raise ParamsError(
                f"grpo.vllm_max_model_length ({self.grpo.vllm_max_model_length}) is less than "
                f"prepare.max_prompt_tokens + grpo.max_completion_length ({longest})"
            )
        measured = {spec.questions: name for name, spec in self.eval.sets.items()}
        for name, spec in self.prepare.extra_train_sets.items():
            if spec.questions in measured:  # training on a measured set's answers
                raise ParamsError(
                    f"prepare.extra_train_sets.{name} trains on {spec.questions}, which "
                    f"eval.sets.{measured[spec.questions]} evaluates"
                )

    def _check_constrained_vllm(self) -> None:
        """grpo.constrained on vLLM needs one engine that generates this process's prompts
        alone: TRL 1.16 gives a vLLM server one `structured_outputs` for every prompt of a
        batch (all processes' prompts, any databases), and a tensor-parallel engine generates its
        group's prompts, which this process has no grammars for (docs/grammar.md)."""
        g = self.grpo
        if not (g.constrained and g.use_vllm):
            return
        if g.vllm_mode == "server":
            how = (
                "grpo.vllm_mode server: TRL 1.16 sends the server one structured_outputs "
                "(vllm_structured_outputs_regex or generation_kwargs) for a whole batch, whose "
                "prompts ask different databases"
            )
        elif g.vllm_tensor_parallel_size > 1:
            how = (
                f"grpo.vllm_tensor_parallel_size {g.vllm_tensor_parallel_size}: the engine "
                "generates its group's prompts, gathered inside TRL"
            )
        else:
            return
        raise ParamsError(
            f"grpo.constrained needs a grammar per prompt, which TRL 1.16 cannot give with {how}. "
            "Use grpo.vllm_mode colocate with grpo.vllm_tensor_parallel_size 1, grpo.use_vllm "
            "false, or grpo.constrained false (docs/grammar.md)"
        )

    def _check_agent_vllm(self, world: int) -> None:
        """TRL 1.16's tool loop runs as many turns on each process as its own rollouts call
        tools for, so the processes' turn counts differ; a vLLM generation that every process
        must join (a gather of the prompts in server mode, an all-gather over the tensor
        parallel group in colocate) then waits forever for a process that has stopped."""
        g = self.grpo
        if world == 1 or g.rollout not in TOOL_ROLLOUTS or not g.use_vllm:
            return
        if g.vllm_mode == "server":
            how = "grpo.vllm_mode server gathers every process's prompts for each turn"
        elif g.vllm_tensor_parallel_size > 1:
            how = (
                f"grpo.vllm_tensor_parallel_size {g.vllm_tensor_parallel_size} gathers its "
                "group's prompts for each turn"
            )
        else:
            return
        raise ParamsError(
            f"grpo.rollout agent with vLLM would hang under launch.num_processes {world}: "
            f"{how}, and each process runs as many tool turns as its own rollouts need. Use "
            "launch.num_processes 1, or grpo.vllm_mode colocate with "
            "grpo.vllm_tensor_parallel_size 1"
        )


_PARAMS = TypeAdapter(Params)


def _problem(error: dict) -> str:
    """One pydantic error as `full.key: what is wrong (got value)`."""
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "missing":
        return f"missing key {key}"
    if error["type"] == "unexpected_keyword_argument":
        return f"unknown key {key}"
    cause = error.get("ctx", {}).get("error")
    if isinstance(cause, ParamsError):  # a check across settings names its own keys
        return str(cause)
    message = str(cause) if cause is not None else error["msg"]
    if isinstance(error["input"], dict):  # a section-wide check: its message names the value
        return f"{key}: {message}"
    return f"{key}: {message} (got {error['input']!r})"


def params_from_dict(data: dict) -> Params:
    """Validate already-loaded params (e.g. a composed config) into `Params`."""
    try:
        return _PARAMS.validate_python(data)
    except ValidationError as exc:
        raise ParamsError("; ".join(_problem(e) for e in exc.errors())) from None


def load_params(path: str | Path = "params.yaml") -> Params:
    """Read and validate params.yaml; errors name the file and the offending key."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ParamsError(
            f"{path}: not found (run from the repo root, or compose it with `dvc exp run`)"
        ) from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path}: not valid YAML: {exc}") from None
    try:
        return params_from_dict(data)
    except ParamsError as exc:
        raise ParamsError(f"{path}: {exc}") from None


def composed_yaml(profile: str | None = None, overrides: list[str] | None = None) -> str:
    """params.yaml text for a profile, as `dvc exp run -S profile=...` would write it."""
    from omegaconf import OmegaConf

    return OmegaConf.to_yaml(OmegaConf.create(compose_params(profile, overrides)))


def compose_params(
    profile: str | None = None, overrides: list[str] | None = None, conf_dir: str | Path = "conf"
) -> dict:
    """Compose conf_dir the way `dvc exp run` does (Hydra), returning the plain dict."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    overrides = list(overrides or [])
    if profile is not None:
        overrides.append(f"profile={profile}")
    from hydra.errors import HydraException

    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base=None):
        try:
            cfg = compose(config_name="config", overrides=overrides)
        except HydraException as exc:  # e.g. an override of a key the config lacks
            raise ParamsError(str(exc).splitlines()[0]) from None
    return OmegaConf.to_container(cfg, resolve=True)


def main(argv: list[str] | None = None) -> int:
    """python -m sqlrl.params [PROFILE] [KEY=VALUE ...] > params.yaml"""
    import argparse
    import sys

    parser = argparse.ArgumentParser(
        prog="python -m sqlrl.params",
        description="Print the params.yaml that a profile composes to, as `dvc exp run -S "
        "profile=...` writes it (conf/config.yaml + conf/profile/PROFILE.yaml + overrides).",
        epilog="python -m sqlrl.params > params.yaml recomposes the committed default.",
    )
    profiles = sorted(p.stem for p in Path("conf/profile").glob("*.yaml"))
    parser.add_argument(
        "profile", nargs="?", help=f"a profile ({', '.join(profiles) or 'conf/profile/*.yaml'})"
    )
    parser.add_argument("overrides", nargs="*", help="KEY=VALUE, as dvc exp run -S takes them")
    args = parser.parse_args(argv)
    if args.profile and profiles and args.profile not in profiles:
        parser.error(f"no profile {args.profile!r}: one of {', '.join(profiles)}")
    text = composed_yaml(args.profile, args.overrides)
    params_from_dict(yaml.safe_load(text))  # what a stage would refuse is refused here
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    import sys

    try:
        sys.exit(main())
    except ParamsError as exc:
        sys.exit(f"error: {exc}")
