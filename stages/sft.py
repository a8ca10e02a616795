"""DVC stage `sft`: models/base + data/prepared/sft.jsonl -> models/sft, metrics/sft.json,
and the training curves in dvclive/sft/plots/metrics."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("DVC_NO_ANALYTICS", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from sqlrl.data.prompt_settings import write_prompt_settings  # noqa: E402
from sqlrl.jsonio import write_json  # noqa: E402
from sqlrl.params import load_params  # noqa: E402
from sqlrl.train.launch import is_main_process  # noqa: E402
from sqlrl.train.sft import train_sft  # noqa: E402
from stages import run_stage  # noqa: E402


def main() -> int:
    params = load_params()
    metrics = train_sft(
        params.sft,
        params.seed,
        "models/base",
        "data/prepared/sft.jsonl",
        "models/sft",
        torch_threads=params.torch_threads,
    )
    if not is_main_process():  # rank 0 writes the model folder and the metrics
        return 0
    # the prompts this model was trained on, for the server (never the workspace's params)
    write_prompt_settings("models/sft", params.prepare, params.eval.schema_repair)
    write_json("metrics/sft.json", metrics)
    print(
        f"sft: {metrics['rows_trained']} of {metrics['examples']} rows trained (none cut), "
        f"{metrics['steps']} steps, final loss {metrics['final_loss']}, "
        f"{metrics['wall_seconds']} s, {metrics['tokens_per_second']} tokens/s "
        f"({'bf16' if metrics['bf16'] else 'fp32'}: {metrics['bf16_reason']}) -> models/sft"
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_stage("sft", main))
