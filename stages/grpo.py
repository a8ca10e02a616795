"""DVC stage `grpo`: models/sft + data/grpo_prompts.jsonl -> models/grpo_adapter (LoRA),
metrics/grpo.json and the reward/loss curves in dvclive/grpo/."""

from __future__ import annotations

import sys

from sqlrl.jsonio import read_jsonl, write_json
from sqlrl.params import load_params
from sqlrl.train.grpo import PROMPTS_PATH, ROW_KEYS, reward_functions, train_grpo
from sqlrl.train.launch import is_main_process
from stages import run_stage

SFT_DIR = "models/sft"


def main() -> int:
    params = load_params()
    rows = read_jsonl(PROMPTS_PATH, ROW_KEYS)
    metrics = train_grpo(
        params.grpo,
        params.seed,
        SFT_DIR,
        rows,
        "models/grpo_adapter",
        reward_functions(params.grpo),
        torch_threads=params.torch_threads,
    )
    metrics["train_prompts"] = len(rows)  # what each filter dropped: metrics/grpo_prompts.json
    if is_main_process():
        write_json("metrics/grpo.json", metrics)
    return 0


if __name__ == "__main__":
    sys.exit(run_stage("grpo", main))
