"""DVC stage `grpo_prompts`: the SFT model + the candidate prompts -> the GRPO training prompts
after the filters, and metrics saying what each filter dropped.

A stage of its own because the pass-rate filter samples the SFT model (minutes on a CPU):
`dvc exp run -S grpo.steps=500` reuses the selection and reruns only grpo and what follows.
The SFT model is sampled by evaluation's generator factory (`sqlrl.model.generate.make_generator`):
vLLM when grpo.use_vllm is set and vLLM is installed, else transformers on the GPU when there
is one, in the model's dtype; grpo.batch_size prompts a batch, grpo.max_completion_length
tokens, grpo.temperature, with nothing taken from the model's generation_config.json.
A pass is the execution reward, asked for by name, in the format the rollout's Format samples
its pass rates in (`pass_rate_format`: the agent's samples answer without tools).
"""

from __future__ import annotations

import sys
from pathlib import Path

from sqlrl.formats import get_format
from sqlrl.hardware import set_torch_threads
from sqlrl.jsonio import read_jsonl, write_json, write_jsonl
from sqlrl.params import GrpoParams, load_params
from sqlrl.sql.executor import SQLExecutor
from sqlrl.train.grpo_prompts import ROW_KEYS, sampled_pass_rates, select_prompts
from sqlrl.train.rewards import reward_registry
from stages import stage_main


def pass_rate_generator(model_dir: str | Path, grpo: GrpoParams, seed: int):
    """(generator, tokenizer) that samples `model_dir` for the pass rates, as grpo asks.
    A batch holds grpo.batch_size completions (batch_size / samples prompts), as a GRPO step
    does: with transformers a batch runs until its longest sample ends, so smaller batches waste
    less (default model, 64 prompts x 8 samples: 32 prompts a batch 1.36 s/prompt, 8 0.55,
    2 0.37)."""
    from sqlrl.model.generate import make_generator

    prompts_per_batch = max(1, grpo.batch_size // grpo.pass_rate_filter.samples)
    return make_generator(
        model_dir,
        use_vllm=grpo.use_vllm,
        batch_size=prompts_per_batch,
        max_new_tokens=grpo.max_completion_length,
        seed=seed,
        desc="pass rate",
        setting="grpo.use_vllm",
    )


def arguments(parser) -> None:
    parser.add_argument("--model", required=True, help="the SFT model folder, sampled")
    parser.add_argument("--prompts", required=True, help="grpo.jsonl, the candidates")
    parser.add_argument("--spider", required=True, help="the Spider release")
    parser.add_argument("--out", required=True, help="the selected prompts (JSONL)")
    parser.add_argument("--metrics", required=True)


def main(args) -> int:
    params = load_params(args.params)
    grpo = params.grpo
    set_torch_threads(params.torch_threads)
    sampled_format = get_format(grpo.rollout).pass_rate_format()
    execution_reward = reward_registry(grpo, args.spider, sampled_format.name)["execution"]

    def pass_rates(rows):
        generator, tokenizer = pass_rate_generator(args.model, grpo, params.seed)
        return sampled_pass_rates(
            sampled_format.rows(rows),  # the format's prompts; the rows kept are prepare's
            generator,
            tokenizer,
            grpo.pass_rate_filter.samples,
            grpo.temperature,
            params.seed,
            execution_reward,
        )

    rows = read_jsonl(args.prompts, ROW_KEYS)
    selected, stats = select_prompts(rows, grpo, params.seed, SQLExecutor(), pass_rates)
    print(
        f"grpo_prompts: {stats.kept} of {stats.candidates} prompts kept {stats.as_metrics()}",
        file=sys.stderr,
    )
    write_jsonl(args.out, selected)
    write_json(args.metrics, stats.as_metrics())
    return 0


if __name__ == "__main__":
    sys.exit(stage_main("grpo_prompts", main, arguments, __doc__))
