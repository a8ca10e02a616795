"""conf/accelerate/*.yaml load with accelerate's own loader (`accelerate launch --config_file`
reads them the same way) and resolve to the launch their header comment promises."""

from __future__ import annotations

import pytest
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType

from tests.repo_tools import REPO_ROOT

CONFIGS = REPO_ROOT / "conf" / "accelerate"


@pytest.mark.parametrize(
    "name,kind",
    [("ddp.yaml", DistributedType.MULTI_GPU), ("zero3.yaml", DistributedType.DEEPSPEED)],
)
def test_each_config_loads_with_accelerates_loader(name, kind):
    config = load_config_from_file(str(CONFIGS / name))
    assert isinstance(config, ClusterConfig) and config.distributed_type == kind
    assert config.mixed_precision == "no"  # the trainer's bf16 setting decides
    assert config.num_machines == 1 and not config.use_cpu


def test_zero3_shards_everything_and_saves_whole_weights():
    deepspeed = load_config_from_file(str(CONFIGS / "zero3.yaml")).deepspeed_config
    assert deepspeed["zero_stage"] == 3 and deepspeed["zero3_save_16bit_model"] is True
    # left to the trainer's args ("auto"): a value here could disagree with grpo.grad_accum
    assert "gradient_accumulation_steps" not in deepspeed and "gradient_clipping" not in deepspeed


@pytest.mark.parametrize("name,flag", [("ddp.yaml", "multi_gpu"), ("zero3.yaml", "use_deepspeed")])
def test_num_processes_on_the_command_line_overrides_the_config(name, flag):
    """What `accelerate launch --config_file ... --num_processes 4` resolves to (no launch)."""
    config = str(CONFIGS / name)
    parser = launch_command_parser()
    args, _, _ = _validate_launch_command(parser.parse_args(["--config_file", config, "x.py"]))
    assert args.num_processes == 2 and getattr(args, flag) is True
    args, _, _ = _validate_launch_command(
        parser.parse_args(["--config_file", config, "--num_processes", "4", "x.py"])
    )
    assert args.num_processes == 4 and getattr(args, flag) is True
