"""DVC stage `grpo_prompts`: models/sft + data/prepared/grpo.jsonl -> data/grpo_prompts.jsonl
(the GRPO training prompts after the filters) and metrics/grpo_prompts.json (what each dropped).

A stage of its own because the pass-rate filter samples the SFT model (minutes on a CPU):
`dvc exp run -S grpo.steps=500` reuses the selection and reruns only grpo and what follows.
"""
from __future__ import annotations

import sys

from sqlrl.evaluate import read_jsonl, write_jsonl
from sqlrl.executor import SQLExecutor
from sqlrl.grpo import PROMPTS_PATH, reward_functions, sampled_pass_rates, select_prompts
from sqlrl.metrics import write_metrics
from sqlrl.params import load_params

SFT_DIR = "models/sft"


def main() -> int:
    params = load_params()
    grpo = params.grpo
    execution_reward = reward_functions(grpo)[0]

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
    print(f"grpo_prompts: {stats.kept} of {stats.candidates} prompts kept {stats.as_metrics()}",
          file=sys.stderr)
    write_jsonl(PROMPTS_PATH, selected)
    write_metrics("metrics/grpo_prompts.json", stats.as_metrics())
    return 0


if __name__ == "__main__":
    sys.exit(main())
