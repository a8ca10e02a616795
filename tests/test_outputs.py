"""Model folders are written whole or not at all, and the same run writes the same bytes."""

from __future__ import annotations

import json

import pytest

from sqlrl.outputs import save_atomically
from sqlrl.train.grpo import sort_adapter_config


def test_a_save_that_fails_leaves_the_previous_output_in_place(tmp_path):
    out = tmp_path / "models" / "final"
    save_atomically(
        out, lambda folder: (folder.mkdir(parents=True), (folder / "w").write_text("1"))
    )
    assert (out / "w").read_text() == "1"

    def crash(folder):
        folder.mkdir(parents=True)
        (folder / "w").write_text("half")
        raise RuntimeError("killed mid-save")

    with pytest.raises(RuntimeError):
        save_atomically(out, crash)
    assert (out / "w").read_text() == "1"  # not the half-written one
    save_atomically(
        out, lambda folder: (folder.mkdir(parents=True), (folder / "w").write_text("2"))
    )
    assert (out / "w").read_text() == "2" and not (tmp_path / "models" / "final.tmp").exists()


def test_the_adapter_config_lists_its_modules_in_one_order(tmp_path):
    """PEFT saves target_modules from a set: two runs of the same training wrote them in two
    orders (a different DVC hash for the same adapter)."""
    from peft import LoraConfig

    orders = (["v_proj", "q_proj", "o_proj"], ["o_proj", "v_proj", "q_proj"])
    written = []
    for k, modules in enumerate(orders):
        folder = tmp_path / str(k)
        LoraConfig(r=4, target_modules=modules).save_pretrained(folder)
        config = json.loads((folder / "adapter_config.json").read_text())
        config["target_modules"] = modules  # as a set may come out
        (folder / "adapter_config.json").write_text(json.dumps(config))
        sort_adapter_config(folder)
        written.append((folder / "adapter_config.json").read_bytes())
    assert written[0] == written[1]
    assert sorted(LoraConfig.from_pretrained(tmp_path / "0").target_modules) == sorted(orders[0])
