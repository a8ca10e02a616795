"""The install plan, made on the CPU by `bundle --wheels`: how the lent GPU image meets each
package the run needs (its own, carried, or carried for where its version is refused), the
wheels downloaded for the GPU machine's Python, packed into at most two calls of the device
tool within what one call carries (a wheel too large for one call cut over both), each call's
folder (call.json, versions.json, wheels, parts), and the calls' commands as `bundle` prints
them and docs/gpu-rehearsal.md gives them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from sqlrl.jsonio import write_json
from sqlrl.train.gpu_rehearsal.common import CALL_FILE, REPO, VERSIONS_FILE, folder_mib, log, sha256
from sqlrl.train.gpu_rehearsal.versions import EXACT, PROVIDED, canonical, dependency_closure

# One call of the device tool carries the working tree and the paths it names together, at most
# this many MiB; a call's wheels (and the bundle, in the last call) get what the tree leaves,
# less HEADROOM_MIB for later edits. Files a call installs under /tmp stay there while the
# machine stays warm (30 s after a call), so a second call made at once finds them.
CARRY_LIMIT_MIB = 64
HEADROOM_MIB = 2
CALL_FILES_MIB = 0.25  # a call's call.json and versions.json, the bundle's manifest.json
MAX_CALLS = 2
SITE = "/tmp/site"  # where the calls install; first on the run's PYTHONPATH

# The image ('cuda') this workplace lends its GPU machines with (python3 3.12.3), as its device
# notes list it (2026-11): versions where they were read there, else only that it is there. A
# package it has at a version the run accepts is used as it is; one it lacks, or has at a
# version the run may refuse, is carried. Names not listed count as missing.
IMAGE_VERSIONS = {
    "torch": "2.11.0",
    "transformers": "5.17.0",
    "accelerate": "1.15.0",
    "numpy": "2.5.2",
    "tokenizers": "0.23.2",
    "safetensors": "0.8.0",
    "tiktoken": "0.14.0",
    "huggingface-hub": "1.33.0",
}
IMAGE_UNVERSIONED = frozenset(
    {
        "anyio",
        "certifi",
        "charset-normalizer",
        "click",
        "filelock",
        "fsspec",
        "h11",
        "hf-xet",
        "httpcore",
        "httpx",
        "idna",
        "jinja2",
        "markupsafe",
        "packaging",
        "pandas",
        "peft",
        "psutil",
        "pyarrow",
        "python-dateutil",
        "pyyaml",
        "regex",
        "requests",
        "six",
        "tqdm",
        "typing-extensions",
        "urllib3",
        "xxhash",
    }
)
# Wheels for x86-64 Linux with glibc 2.28 or newer (manylinux_2_28 and the older tags).
WHEEL_PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_12_x86_64",
    "manylinux2010_x86_64",
    "manylinux_2_5_x86_64",
    "manylinux1_x86_64",
)


def tree_mib() -> float:
    """What travels with every call: the repo's tracked and untracked-not-ignored files."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    paths = [REPO / name for name in names.split("\0") if name]
    return round(sum(p.stat().st_size for p in paths if p.is_file()) / 2**20, 2)


def download_wheels(names_versions: dict[str, str], dest: Path, python_version: str) -> dict:
    """{name: wheel path} for each package at its version, for CPython `python_version` on
    x86-64 Linux, no dependencies (the closure already names them all)."""
    platforms = [arg for p in WHEEL_PLATFORMS for arg in ("--platform", p)]
    dest.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [
            *(sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"),
            *("--python-version", python_version, "--implementation", "cp", *platforms),
            *("-d", str(dest)),
            *(f"{name}=={version}" for name, version in sorted(names_versions.items())),
        ],
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise SystemExit(f"pip download failed:\n{result.stdout[-2000:]}{result.stderr[-3000:]}")
    wheels = {canonical(path.name.split("-")[0]): path for path in dest.glob("*.whl")}
    missing = sorted(set(names_versions) - set(wheels))
    if missing:
        raise SystemExit(f"pip download returned no wheel for {', '.join(missing)}")
    return wheels


def carry_kind(name: str, entry: dict) -> tuple[str, str]:
    """How the lent image meets a package the run needs, as (kind, why): `exact` (carried and
    always installed: the code under test), `missing` (carried: the image lacks it, or has a
    version a dependent refuses), `insurance` (carried, but installed only where the machine's
    version is refused: the image has it at a version not known here, and a dependent
    constrains it) or `image` (not carried: the image's is used as it is)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    requires = {dependent: spec for dependent, spec in entry["requires"].items() if spec}
    if name in EXACT:
        return "exact", f"carried: the code under test, at requirements.txt's {entry['version']}"
    if name in IMAGE_VERSIONS:
        have = IMAGE_VERSIONS[name]
        refused = [
            f"{dependent} requires {spec}"
            for dependent, spec in requires.items()
            if not SpecifierSet(spec).contains(Version(have), prereleases=True)
        ]
        if refused:
            return "missing", f"carried: the image's {have} is refused ({'; '.join(refused)})"
        return "image", f"not carried: the image's {have} is used as it is"
    if name in IMAGE_UNVERSIONED:
        if requires:
            return "insurance", (
                "carried, installed only where the machine's version is refused: the image "
                "has it, at a version not known here"
            )
        return "image", "not carried: the image's is used as it is (no dependent constrains it)"
    return "missing", "carried: the image lacks it"


def pack_calls(sizes: dict[str, int], order: list[str], room: list[int]) -> tuple[list, dict]:
    """Each wheel (bytes) into the calls' room (bytes each), in `order`: whole into the first
    call with room for it, else cut over the calls' remaining room in call order when together
    they hold it (the wheel is joined and installed in the call with its last part). Returns
    ([[(name, offset, bytes), ...] per call], {left out: why})."""
    free, calls, left_out = list(room), [[] for _ in room], {}
    for name in order:
        size = sizes[name]
        whole = next((i for i, f in enumerate(free) if size <= f), None)
        if whole is not None:
            calls[whole].append((name, 0, size))
            free[whole] -= size
        elif size <= sum(max(f, 0) for f in free):
            offset = 0
            for i, f in enumerate(free):
                take = min(max(f, 0), size - offset)
                if take:
                    calls[i].append((name, offset, take))
                    free[i] -= take
                    offset += take
        else:
            left_out[name] = (
                f"not carried: its {size / 2**20:.1f} MiB wheel is over the "
                f"{sum(max(f, 0) for f in free) / 2**20:.1f} MiB the calls' carry limit leaves"
            )
    return calls, left_out


def write_calls(root: Path, calls: list, wheels: dict[str, Path], expected: dict) -> list[dict]:
    """root/call-N: the wheels call N carries (whole under wheels/, cut ones under parts/ as
    WHEEL.OFFSET), its call.json and a copy of versions.json (the install step decides with
    it). Returns each call's call.json."""
    plan_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    written = []
    for number, items in enumerate(calls, 1):
        folder = root / f"call-{number}"
        (folder / "wheels").mkdir(parents=True)
        call = {"call": number, "calls": len(calls), "plan": plan_id, "wheels": [], "parts": []}
        for name, offset, size in items:
            path = wheels[name]
            total = path.stat().st_size
            if size == total:
                shutil.copyfile(path, folder / "wheels" / path.name)
                call["wheels"].append(path.name)
                continue
            (folder / "parts").mkdir(exist_ok=True)
            with (
                path.open("rb") as source,
                (folder / "parts" / f"{path.name}.{offset}").open("wb") as part,
            ):
                source.seek(offset)
                part.write(source.read(size))
            call["parts"].append(
                {
                    "wheel": path.name,
                    "file": f"{path.name}.{offset}",
                    "offset": offset,
                    "bytes": size,
                    "total": total,
                    "last": offset + size == total,
                    "sha256": sha256(path),
                }
            )
        write_json(folder / CALL_FILE, call)
        write_json(folder / VERSIONS_FILE, expected)
        written.append(call)
    return written


def plan_commands(root: Path, calls: int, budget_s: float = 360.0) -> list[dict]:
    """The device tool's calls, in order: each carries its call-N folder and installs it into
    SITE; the last one also carries the bundle and runs. Paths are the repo-relative ones the
    tool carries (root must be inside the repo for that)."""
    rel = root.resolve().relative_to(REPO) if root.resolve().is_relative_to(REPO) else root
    run = (
        f"PYTHONPATH={SITE}:. PYTHONUNBUFFERED=1 python3 scripts/gpu_rehearsal.py run "
        f"--bundle {rel}/bundle"
    )
    if calls == 0:  # nothing to install: the machine has it all
        return [
            {
                "call": 1,
                "carry": [f"{rel}/bundle"],
                "timeout_s": int(budget_s + 120),
                "command": run,
            }
        ]
    plan = []
    for number in range(1, calls + 1):
        install = f"python3 scripts/gpu_rehearsal.py install {rel}/call-{number}"
        carry = [f"{rel}/call-{number}"]
        if number < calls:
            plan.append({"call": number, "carry": carry, "timeout_s": 120, "command": install})
        else:
            carry.insert(0, f"{rel}/bundle")
            timeout = int(budget_s + 120)
            plan.append(
                {
                    "call": number,
                    "carry": carry,
                    "timeout_s": timeout,
                    "command": f"{install} && {run}",
                }
            )
    return plan


def image_kinds(closure: dict) -> dict[str, tuple[str, str]]:
    """carry_kind of every package but the PROVIDED ones."""
    return {name: carry_kind(name, e) for name, e in closure.items() if name not in PROVIDED}


def image_closure(roots, environment: dict) -> dict[str, dict]:
    """dependency_closure for the lent image: a package the image has at a version the run
    accepts came with its own dependencies there, so they are neither carried nor checked.
    Following fewer packages only drops requirements, so this settles in a few rounds."""
    image: set[str] = set()
    while True:
        closure = dependency_closure(roots, environment, frozenset(image))
        used = {name for name, (kind, _) in image_kinds(closure).items() if kind == "image"}
        if used <= image:
            return closure
        image |= used


def choose_calls(root: Path, closure: dict, python_version: str, budget_mib: float):
    """Download every carried package's wheel (all but the image's own) into root/.download and
    pack them into at most MAX_CALLS calls of budget_mib each (the bundle rides in the last).
    Returns (kinds, [[(name, offset, bytes)] per call], wheels, left out). A package the run
    cannot do without (exact or missing) that no call can hold stops the bundle here, not on
    the GPU."""
    kinds = image_kinds(closure)
    wanted = {
        name: closure[name]["version"]
        for name, (kind, _) in kinds.items()
        if kind != "image" and closure[name]["version"] is not None
    }
    log(f"bundle: downloading {len(wanted)} wheels for CPython {python_version}")
    wheels = download_wheels(wanted, root / ".download", python_version)
    sizes = {name: path.stat().st_size for name, path in wheels.items()}
    order = sorted(wheels, key=lambda name: (kinds[name][0] == "insurance", sizes[name]))
    # each call also carries its call.json and versions.json, the last one the bundle too
    room = [int((budget_mib - CALL_FILES_MIB) * 2**20)] * MAX_CALLS
    room[-1] -= int(folder_mib(root / "bundle") * 2**20)
    calls, left_out = pack_calls(sizes, order, room)
    required = [name for name in left_out if kinds[name][0] != "insurance"]
    if required:
        raise SystemExit(
            "cannot carry what the run needs: "
            + "; ".join(f"{name} {left_out[name]}" for name in required)
        )
    return kinds, [items for items in calls if items], wheels, left_out


def print_plan(calls: list[dict], budget_mib: float) -> None:
    """The device tool's calls, each as run's arguments (command, carry, timeout_s): make them
    one right after the other (what a call installs under /tmp lasts while the machine stays
    warm, 30 s after a call)."""
    order = ", one right after the other" if len(calls) > 1 else ""
    print(f"\nThe GPU run in {len(calls)} call(s) of the device tool{order}:")
    for call in calls:
        print(
            f"\ncall {call['call']} ({call['carry_mib']} of {budget_mib} MiB carried): "
            + json.dumps({key: call[key] for key in ("command", "carry", "timeout_s")}, indent=2),
            flush=True,
        )
