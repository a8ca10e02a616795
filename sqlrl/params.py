"""The one typed loader for params.yaml.

params.yaml is composed by DVC's Hydra support from conf/ (conf/config.yaml + a `profile`).
Every stage reads its section through these dataclasses, so a typo or a missing key fails at
load time with the key's full name, not deep inside a training loop.
The values live only in conf/; these classes hold names and types, not defaults.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sqlrl.errors import PipelineError

SCHEMA_FORMATS = ("compact", "ddl")
DTYPES = ("float32", "bfloat16", "float16")
TOKENIZERS = ("trained", "qwen2.5")
VLLM_MODES = ("colocate", "server")


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


def _check_bf16(name: str, value: bool | str) -> None:
    if value not in (True, False, "auto"):
        raise ParamsError(f"{name} must be true, false or auto, got {value!r}")


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


@dataclass(frozen=True)
class AugmentParams:
    """Schema-grounding augmentation of sft.jsonl (sqlrl/data/augment.py); copies: 0 = off."""

    copies: float  # augmented copies per training example, added to sft.jsonl; a
    # fraction copies that share of the examples (0.5: a seeded half)
    shuffle_schema: bool  # tables and columns in a random order in the copies
    rename_prob: float  # per-name probability of a consistent rename in the copies

    def __post_init__(self):
        if self.copies < 0:
            raise ParamsError("prepare.augment.copies must be >= 0")
        if not 0.0 <= self.rename_prob <= 1.0:
            raise ParamsError(
                f"prepare.augment.rename_prob must be in [0, 1], got {self.rename_prob}"
            )


@dataclass(frozen=True)
class PrepareParams:
    schema_format: str  # "compact" (table | col, col | ...) or "ddl" (CREATE TABLE)
    sample_rows: int  # DDL only: N example rows per table, read from the database
    include_train_others: bool  # also train on train_others.json (Spider's extra 1659)
    heldout_fraction: float  # share of each training database's questions kept for heldout
    max_train_examples: int  # 0 = all; the smoke profile uses a few dozen
    max_dev_examples: int  # 0 = all
    system_prompt: str
    augment: AugmentParams
    mark_schema_mentions: bool  # append the schema names the question mentions (all splits)
    # DDL sample rows: a database whose prompt would pass this many tokens (Qwen2.5's
    # tokenizer) gets fewer sample rows, down to none; 0 = no limit
    max_prompt_tokens: int

    def __post_init__(self):
        if self.schema_format not in SCHEMA_FORMATS:
            raise ParamsError(
                f"prepare.schema_format must be one of {SCHEMA_FORMATS}, got {self.schema_format!r}"
            )
        if not 0.0 <= self.heldout_fraction < 1.0:
            raise ParamsError(
                f"prepare.heldout_fraction must be in [0, 1), got {self.heldout_fraction}"
            )
        for name in ("sample_rows", "max_train_examples", "max_dev_examples", "max_prompt_tokens"):
            if getattr(self, name) < 0:
                raise ParamsError(f"prepare.{name} must be >= 0")


@dataclass(frozen=True)
class ArchitectureParams:
    """A Qwen2 configuration for a model built from scratch (CPU profile)."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    vocab_size: int


@dataclass(frozen=True)
class BaseParams:
    source: str  # "hub" (pretrained, pinned) or "scratch" (built from params)
    model_id: str  # hub repo id or a local folder standing in for one
    revision: str  # pinned commit of the hub repo
    dtype: str  # "float32" | "bfloat16": the dtype every model folder is saved in
    tokenizer: str  # scratch only: "trained" (BPE on the training text) | "qwen2.5"
    architecture: ArchitectureParams

    def __post_init__(self):
        if self.source not in ("hub", "scratch"):
            raise ParamsError(f"base.source must be 'hub' or 'scratch', got {self.source!r}")
        if self.dtype not in DTYPES:
            raise ParamsError(f"base.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.tokenizer not in TOKENIZERS:
            raise ParamsError(f"base.tokenizer must be one of {TOKENIZERS}, got {self.tokenizer!r}")


@dataclass(frozen=True)
class LoraParams:
    r: int
    alpha: int
    dropout: float
    target_modules: list[str]


@dataclass(frozen=True)
class SftParams:
    use_lora: bool  # False: fine-tune all weights (random init does not learn LoRA)
    lora: LoraParams
    epochs: float
    learning_rate: float
    batch_size: int  # rows per forward/backward pass per process, at most
    rows_per_step: int  # rows per optimizer step over all processes (the recipe's batch)
    max_length: int
    bf16: bool | str  # true | false | auto (sqlrl/hardware.py: bf16 where it is fast)
    gradient_checkpointing: bool
    lr_scheduler: str  # transformers scheduler name: cosine, linear, constant, ...
    warmup_ratio: float  # share of the steps spent warming up the learning rate
    weight_decay: float
    group_by_length: bool  # batches of similar length (less padding: faster on a CPU)
    attn_implementation: str  # "sdpa" | "eager" | "flash_attention_2"
    logging_steps: int
    completion_only_loss: bool  # False: the prompt tokens are trained on too (schema + question)
    # with completion_only_loss false: a prompt token's loss weight relative to a completion
    # token's (1.0: every token alike; smaller keeps the completion from being drowned out)
    prompt_loss_weight: float
    save_steps: int  # checkpoint every N optimizer steps (sft.resume); 0 = none
    resume: bool  # continue from the last checkpoint of an interrupted run with the same inputs

    def __post_init__(self):
        _check_bf16("sft.bf16", self.bf16)
        split_per_process(self.rows_per_step, self.batch_size, 1, "sft.rows_per_step")
        if self.save_steps < 0:
            raise ParamsError(f"sft.save_steps must be >= 0, got {self.save_steps}")
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ParamsError(f"sft.warmup_ratio must be in [0, 1), got {self.warmup_ratio}")
        if not 0.0 < self.prompt_loss_weight <= 1.0:
            raise ParamsError(
                "sft.prompt_loss_weight must be in (0, 1] (use "
                "completion_only_loss: true for no prompt loss), got "
                f"{self.prompt_loss_weight}"
            )

    def per_process(self, world_size: int = 1) -> tuple[int, int]:
        """(rows per pass, passes per optimizer step) for each of world_size processes."""
        return split_per_process(
            self.rows_per_step, self.batch_size, world_size, "sft.rows_per_step"
        )


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the GRPO reward functions (sqlrl/train/rewards.py); 0 leaves a reward out."""

    execution: float  # 1.0 when the result equals the gold result
    syntax: float  # small bonus for SQL that parses and executes


@dataclass(frozen=True)
class PassRateFilter:
    """Keep prompts the SFT model solves sometimes but not always (groups that carry signal)."""

    pool: int  # prompts to sample with the SFT model; 0 = filter off
    samples: int  # completions per prompt
    min_rate: float  # keep prompts whose pass rate is in [min_rate, max_rate]
    max_rate: float


@dataclass(frozen=True)
class GrpoParams:
    steps: int  # optimizer steps
    learning_rate: float
    batch_size: int  # completions per forward/backward pass per process, at most
    prompts_per_step: int  # questions per optimizer step over all processes (one generation round)
    num_generations: int  # group size
    temperature: float
    top_p: float  # rollout sampling: 1.0 = off
    top_k: int  # 0 = off
    min_p: float  # 0.0 = off
    repetition_penalty: float  # 1.0 = off
    max_completion_length: int
    loss_type: str  # grpo | dapo | dr_grpo | bnpo | ...
    beta: float  # KL weight (0: no reference model)
    epsilon: float
    epsilon_high: float
    scale_rewards: str  # group | batch | none
    num_iterations: int
    reward_weights: RewardWeights
    reward_timeout_s: float  # wall-time limit per executed query
    executable_credit: float  # reward of a query that runs but is wrong (Arctic-Text2SQL-R1: 0.1)
    schema_repair: bool  # reward the schema-repaired SQL (as eval.schema_repair scores it)
    drop_empty_gold: bool  # drop prompts whose gold result is empty (or only 0/NULL)
    pass_rate_filter: PassRateFilter
    lora: LoraParams
    use_vllm: bool
    vllm_mode: str  # colocate | server
    vllm_gpu_memory_utilization: float  # colocate: vLLM's share of each GPU's memory
    vllm_max_model_length: int  # colocate: vLLM's context (longest prompt + completion)
    vllm_enable_sleep_mode: bool  # colocate: free vLLM's memory during the optimizer step
    vllm_tensor_parallel_size: int  # colocate: GPUs one vLLM engine spans
    vllm_server_host: str  # server mode: the host `trl vllm-serve` listens on
    vllm_server_port: int  # server mode: its port
    vllm_server_timeout_s: float  # server mode: how long to wait for it at start
    bf16: bool | str  # true | false | auto (sqlrl/hardware.py: bf16 where it is fast)
    gradient_checkpointing: bool
    logging_steps: int
    save_steps: int  # checkpoint every N steps (resume)
    resume: bool  # continue from the last checkpoint of an interrupted run

    def __post_init__(self):
        _check_bf16("grpo.bf16", self.bf16)
        if self.batch_size % self.num_generations:
            raise ParamsError(
                f"grpo.batch_size ({self.batch_size}) must be a multiple of "
                f"grpo.num_generations ({self.num_generations})"
            )
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ParamsError("grpo.scale_rewards must be group, batch or none")
        self.per_process(1)
        if not 0.0 < self.top_p <= 1.0 or self.top_k < 0 or not 0.0 <= self.min_p < 1.0:
            raise ParamsError(
                f"grpo sampling: top_p must be in (0, 1], top_k >= 0, min_p in [0, 1); got "
                f"{self.top_p}, {self.top_k}, {self.min_p}"
            )
        if self.repetition_penalty <= 0.0:
            raise ParamsError(
                f"grpo.repetition_penalty must be > 0 (1.0 = off), got {self.repetition_penalty}"
            )
        if not 0.0 <= self.executable_credit < 1.0:
            raise ParamsError(
                f"grpo.executable_credit must be in [0, 1), got {self.executable_credit}"
            )
        self._check_vllm_server()

    def _check_vllm_server(self) -> None:
        """Checked in every mode, when params load: a bad port fails the first stage that
        reads params, not GRPO after hours of SFT."""
        if self.vllm_mode not in VLLM_MODES:
            raise ParamsError(f"grpo.vllm_mode must be one of {VLLM_MODES}, got {self.vllm_mode!r}")
        if not self.vllm_server_host.strip():
            raise ParamsError("grpo.vllm_server_host must not be empty")
        if not 1 <= self.vllm_server_port <= 65535:
            raise ParamsError(
                f"grpo.vllm_server_port must be in [1, 65535], got {self.vllm_server_port}"
            )
        if self.vllm_server_timeout_s < 0:
            raise ParamsError(
                f"grpo.vllm_server_timeout_s must be >= 0, got {self.vllm_server_timeout_s}"
            )
        if not 0.0 < self.vllm_gpu_memory_utilization < 1.0:
            raise ParamsError(
                "grpo.vllm_gpu_memory_utilization must be in (0, 1), got "
                f"{self.vllm_gpu_memory_utilization}"
            )
        if self.vllm_max_model_length <= self.max_completion_length:
            raise ParamsError(
                f"grpo.vllm_max_model_length ({self.vllm_max_model_length}) must exceed "
                f"grpo.max_completion_length ({self.max_completion_length})"
            )
        if self.vllm_tensor_parallel_size < 1:
            raise ParamsError(
                f"grpo.vllm_tensor_parallel_size must be >= 1, got {self.vllm_tensor_parallel_size}"
            )

    def per_process(self, world_size: int = 1) -> tuple[int, int]:
        """(completions per pass, passes per optimizer step) for each of world_size processes:
        prompts_per_step questions x num_generations completions a step, whatever world_size."""
        return split_per_process(
            self.prompts_per_step * self.num_generations,
            self.batch_size,
            world_size,
            "grpo.prompts_per_step x grpo.num_generations",
        )


@dataclass(frozen=True)
class EvalParams:
    batch_size: int
    max_new_tokens: int
    use_vllm: bool  # vLLM where it is installed; transformers otherwise
    num_samples: int  # 1 = greedy; N > 1 = self-consistency (sample N, vote by result)
    temperature: float  # sampling temperature, used only when num_samples > 1
    schema_repair: bool  # map unknown table/column names onto the schema (schema_repair.py)

    def __post_init__(self):
        if self.batch_size < 1 or self.max_new_tokens < 1 or self.num_samples < 1:
            raise ParamsError(
                "eval.batch_size, eval.max_new_tokens and eval.num_samples must be >= 1"
            )
        if self.num_samples > 1 and self.temperature <= 0.0:
            raise ParamsError(
                f"eval.temperature must be > 0 when eval.num_samples > 1, got {self.temperature}"
            )


@dataclass(frozen=True)
class LaunchParams:
    """How many training processes sft and grpo run in (stages/launch.py)."""

    num_processes: int  # per machine: GPUs, or CPU processes (gloo); batch sizes are per process
    config: str  # an accelerate config file (conf/accelerate/); "" = data-parallel defaults

    def __post_init__(self):
        if self.num_processes < 1:
            raise ParamsError(f"launch.num_processes must be >= 1, got {self.num_processes}")
        if self.config and not Path(self.config).is_file():  # relative: to the repo root
            raise ParamsError(f"launch.config: no file {self.config!r} (see conf/accelerate/)")


@dataclass(frozen=True)
class Params:
    seed: int
    profile: str
    torch_threads: int  # CPU threads for torch in every stage; 0 = the usable cores
    launch: LaunchParams
    prepare: PrepareParams
    base: BaseParams
    sft: SftParams
    grpo: GrpoParams
    eval: EvalParams

    def __post_init__(self):
        """What needs two sections: each step's split over launch.num_processes, and a vLLM
        context that holds the longest prompt prepare may write plus a completion."""
        world = self.launch.num_processes
        self.sft.per_process(world)
        self.grpo.per_process(world)
        longest = self.prepare.max_prompt_tokens + self.grpo.max_completion_length
        if self.prepare.max_prompt_tokens and self.grpo.vllm_max_model_length < longest:
            raise ParamsError(
                f"grpo.vllm_max_model_length ({self.grpo.vllm_max_model_length}) is less than "
                f"prepare.max_prompt_tokens + grpo.max_completion_length ({longest})"
            )


def _build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass `cls` from plain YAML data, checking keys and types on the way."""
    if not isinstance(data, dict):
        raise ParamsError(f"{where or 'params'}: expected a mapping, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(names))
    missing = [n for n in names if n not in data]
    if unknown:
        raise ParamsError(f"unknown key(s) {', '.join(_join(where, k) for k in unknown)}")
    if missing:
        raise ParamsError(f"missing key(s) {', '.join(_join(where, k) for k in missing)}")
    values = {n: _convert(hints[n], data[n], _join(where, n)) for n in names}
    return cls(**values)


def _convert(hint: Any, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, where)
    origin = typing.get_origin(hint)
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise ParamsError(f"{where}: expected a list, got {value!r}")
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            if option is type(None) and value is None:
                return None
            try:
                return _convert(option, value, where)
            except ParamsError:
                continue
        raise ParamsError(f"{where}: {value!r} does not match {hint}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float) and isinstance(value, bool) or not isinstance(value, hint):
        raise ParamsError(f"{where}: expected {hint.__name__}, got {value!r}")
    return value


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def params_from_dict(data: dict) -> Params:
    """Validate already-loaded params (e.g. a composed config) into `Params`."""
    return _build(Params, data, "")


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
    with initialize_config_dir(config_dir=str(Path(conf_dir).resolve()), version_base=None):
        cfg = compose(config_name="config", overrides=overrides)
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
