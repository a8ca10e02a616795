"""Every DVC stage depends on the repo code it imports (its import closure, imports inside
functions included), so `dvc repro` cannot call a stage up to date after a change it runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

from sqlrl.paths import REPO_ROOT

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
