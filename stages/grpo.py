"""DVC stage `grpo`: models/sft + data/prepared/grpo.jsonl -> models/grpo_adapter (LoRA),
metrics/grpo.json and the reward/loss curves in dvclive/grpo/."""
from __future__ import annotations

import sys

from sqlrl.evaluate import read_jsonl
from sqlrl.executor import ExecLimits, SQLExecutor
from sqlrl.grpo import select_prompts, sampled_pass_rates, train_grpo
from sqlrl.metrics import write_metrics
from sqlrl.params import load_params
from sqlrl.paths import SPIDER_DIR
from sqlrl.spider import load_schemas
from sqlrl.rewards import make_rewards

SFT_DIR = "models/sft"


def main() -> int:
    params = load_params()
    grpo = params.grpo
    schemas = load_schemas(SPIDER_DIR / "tables.json") if grpo.schema_repair else None
    execution_reward, syntax_reward = make_rewards(ExecLimits(timeout_s=grpo.reward_timeout_s),
                                                   schemas=schemas)

    def pass_rates(rows):
        from sqlrl.generate import HFGenerator
        from sqlrl.modeling import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(SFT_DIR)
        generator = HFGenerator(model, tokenizer, batch_size=grpo.batch_size,
                                max_new_tokens=grpo.max_completion_length, desc="pass rate")
        return sampled_pass_rates(rows, generator, tokenizer, grpo.pass_rate_filter.samples,
                                  grpo.temperature, params.seed, execution_reward)

    rows = read_jsonl("data/prepared/grpo.jsonl")
    selected, stats = select_prompts(rows, grpo, params.seed, SQLExecutor(), pass_rates)
    print(f"grpo: {stats.kept} of {stats.candidates} prompts kept {stats.as_metrics()}",
          file=sys.stderr)
    metrics = train_grpo(grpo, params.seed, SFT_DIR, selected, "models/grpo_adapter",
                         [execution_reward, syntax_reward])
    metrics["prompts"] = stats.as_metrics()
    write_metrics("metrics/grpo.json", metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
