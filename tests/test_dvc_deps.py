"""Every DVC stage depends on the repo code it imports (its import closure, imports inside
functions included), so `dvc repro` cannot call a stage up to date after a change it runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from tests.repo_tools import REPO_ROOT

PACKAGES = ("sqlrl", "stages")


def _module_file(name: str) -> Path | None:
    """The repo file that `import name` runs, or None outside the repo's packages."""
    if not name or name.split(".")[0] not in PACKAGES:
        return None
    base = REPO_ROOT.joinpath(*name.split("."))
    for path in (base / "__init__.py", base.with_suffix(".py")):
        if path.is_file():
            return path
    return None


def _imported_names(path: Path, module: str) -> list[str]:
    """Module names imported anywhere in `path` (as `module`), relative imports resolved."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1]) if node.level else ""
            source = ".".join(p for p in (base, node.module or "") if p)
            names.append(source)
            names += [f"{source}.{alias.name}" for alias in node.names]  # submodules
    return names


def import_closure(module: str) -> set[str]:
    """Repo files (relative paths) that running `python -m module` imports."""
    todo, files = [module], {}
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or path in files.values():
            continue
        files[name] = path
        parts = name.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # parent packages run first
        todo += _imported_names(path, name)
    return {str(p.relative_to(REPO_ROOT)) for p in files.values()}


def _stages() -> list[tuple[str, list[str], list[str]]]:
    """(stage, modules its cmd runs, deps) for every stage of dvc.yaml."""
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    out = []
    for name, stage in stages.items():
        body = stage.get("do", stage)
        match = re.match(r"python -m (\S+)", body["cmd"])
        assert match, f"stage {name}: cmd {body['cmd']!r} is not `python -m <module>`"
        modules = [match.group(1)] + re.findall(r"\s(stages\.\w+)", body["cmd"])  # launched
        out.append((name, modules, [str(d) for d in body.get("deps", [])]))
    return out


def test_the_closure_follows_imports_inside_functions():
    closure = import_closure("stages.grpo_prompts")
    assert "sqlrl/model/generate.py" in closure  # imported inside a function only
    assert {"sqlrl/__init__.py", "stages/__init__.py", "sqlrl/params.py"} <= closure


@pytest.mark.parametrize("stage,modules,deps", _stages(), ids=[s[0] for s in _stages()])
def test_every_imported_repo_file_is_a_dep_of_the_stage(stage, modules, deps):
    def covered(path: str) -> bool:
        return any(path == d or path.startswith(d.rstrip("/") + "/") for d in deps)

    imported = set().union(*(import_closure(module) for module in modules))
    missing = sorted(p for p in imported if not covered(p))
    assert not missing, f"dvc.yaml stage {stage} imports but does not depend on: {missing}"


def test_bytecode_is_not_part_of_a_code_folder_dep():
    """A folder dep (sqlrl/sql, ...) must hash the same whichever Python compiled it."""
    import subprocess

    pyc = "sqlrl/sql/__pycache__/executor.cpython-311.pyc"
    done = subprocess.run(["dvc", "check-ignore", pyc], cwd=REPO_ROOT, capture_output=True)
    assert done.returncode == 0, f"{pyc} is not in .dvcignore: a folder dep would hash it"


def _declared(body: dict, key: str) -> list[str]:
    return [next(iter(e)) if isinstance(e, dict) else str(e) for e in body.get(key) or []]


@pytest.mark.parametrize("stage", [s[0] for s in _stages()])
def test_the_cmd_names_every_file_the_stage_reads_and_writes(stage):
    """dvc.yaml is the one place files are named: a stage that read or wrote a path its cmd
    does not pass would hold that path in code, where dvc.yaml can drift from it."""
    stage_yaml = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"][stage]
    for name, body in _instances(stage_yaml):
        words = body["cmd"].split()
        files = [d for d in _declared(body, "deps") if not d.startswith(PACKAGES)]
        files += _declared(body, "outs") + _declared(body, "metrics") + _declared(body, "plots")
        unnamed = [f for f in files if not any(f == w or f.startswith(w + "/") for w in words)]
        assert not unnamed, f"dvc.yaml stage {name}: its cmd does not pass {unnamed}"


def _instances(stage: dict) -> list[tuple[str, dict]]:
    """A plain stage, or each stage a `foreach` makes, with ${key} and ${item.*} filled in."""
    if "foreach" not in stage:
        return [("", stage)]
    out = []
    for key, item in stage["foreach"].items():
        text = yaml.safe_dump(stage["do"]).replace("${key}", key)
        for field, value in item.items():
            text = text.replace("${item.%s}" % field, value)
        out.append((key, yaml.safe_load(text)))
    return out


# the module holding each training or evaluation stage's own logic
STAGE_MODULES = {
    "sft": "sqlrl/train/sft.py",
    "grpo": "sqlrl/train/grpo.py",
    "merge": "sqlrl/train/merge.py",
    "evaluate": "sqlrl/eval/evaluate.py",
}


def _ancestors(stages: dict) -> dict[str, set[str]]:
    """Stage -> every stage whose outputs it consumes, directly or not."""
    bodies = {name: stage.get("do", stage) for name, stage in stages.items()}
    outs = {name: [o for o in _declared(b, "outs") if "${" not in o] for name, b in bodies.items()}
    direct = {
        name: {
            other
            for other, paths in outs.items()
            if other != name
            and any(d == p or d.startswith(p + "/") for d in _declared(b, "deps") for p in paths)
        }
        for name, b in bodies.items()
    }
    closure = {}
    for name in direct:
        seen, todo = set(), list(direct[name])
        while todo:
            stage = todo.pop()
            if stage not in seen:
                seen.add(stage)
                todo += direct[stage]
        closure[name] = seen
    return closure


def test_no_stage_depends_on_the_code_of_a_stage_after_it():
    """An edit to GRPO's code must leave grpo_prompts (which samples the SFT model) and SFT up
    to date: the deps follow the data flow, never against it."""
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    for stage, earlier in _ancestors(stages).items():
        module = STAGE_MODULES.get(stage)
        for ancestor in earlier if module else ():
            deps = _declared(stages[ancestor].get("do", stages[ancestor]), "deps")
            assert not any(module == d or module.startswith(d.rstrip("/") + "/") for d in deps), (
                f"stage {ancestor} runs before {stage} but depends on {module}"
            )
    assert _ancestors(stages)["grpo"] >= {"grpo_prompts", "sft"}  # the DAG was read


def test_dvcs_default_metrics_view_reads_cleanly_in_one_screen():
    """`dvc metrics show` on the committed metrics: no "failed to load" warning (DVC reads a
    key named `error` as a failure) and a table that fits a 200-column screen: EX per split
    and per evaluation set, EM on Spider's splits, the gains (the detail is in each stage's
    own file, shown with --targets)."""
    import subprocess

    done = subprocess.run(
        ["dvc", "metrics", "show"], cwd=REPO_ROOT, capture_output=True, text=True, check=True
    )
    output = done.stdout + done.stderr
    assert "failed to load" not in output and "headline_final.json" in output
    assert max(len(line) for line in output.splitlines()) <= 200, output
    detail = subprocess.run(
        ["dvc", "metrics", "show", "metrics/eval_final.json", "metrics/sft.json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "failed to load" not in detail.stdout + detail.stderr
    assert "dev.by_hardness.easy.ex" in detail.stdout and "final_loss" in detail.stdout
