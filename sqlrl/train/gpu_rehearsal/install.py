"""The `install` command, on the GPU machine, one call of the plan at a time: a call's wheels go
into the target folder where the machine lacks the package or runs a version the run refuses;
a wheel cut over two calls is joined (and checked against its sha256) in the call with its last
part; a call whose earlier call's install is gone stops at once. It runs with the image's
python3 before the project's packages are there: the standard library and the image's
`packaging` only, and so does everything this module imports."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from sqlrl.jsonio import read_json, write_json
from sqlrl.train.gpu_rehearsal.common import CALL_FILE, VERSIONS_FILE, log, sha256
from sqlrl.train.gpu_rehearsal.versions import canonical, installed_version, version_problems


def install_reason(name: str, want: dict | None, find=None) -> str | None:
    """Why a carried wheel must be installed on this machine, or None where the machine's own
    version is one the run accepts (versions.json: exactly it for the code under test, else
    what its dependents require). `find`: name -> installed version (installed_version)."""
    if want is None:
        return "not in versions.json"
    find = find or installed_version
    problems, _ = version_problems({name: want}, lambda _: find(name))
    return "; ".join(problems) or None


def join_parts(parts: Path, last: dict, out: Path) -> Path:
    """The wheel `last` is the final part of, joined from its parts in `parts` (each named
    WHEEL.OFFSET) and checked against the whole wheel's sha256."""
    pieces = sorted((int(p.name.rsplit(".", 1)[1]), p) for p in parts.glob(f"{last['wheel']}.*"))
    out.mkdir(parents=True, exist_ok=True)
    wheel = out / last["wheel"]
    size = 0
    with wheel.open("wb") as joined:
        for offset, piece in pieces:
            if offset != size:
                raise SystemExit(f"{last['wheel']}: no part at byte {size} in {parts}")
            size += joined.write(piece.read_bytes())
    if size != last["total"] or sha256(wheel) != last["sha256"]:
        raise SystemExit(f"{last['wheel']}: its joined parts do not make the bundled wheel")
    for _, piece in pieces:  # /tmp's disk: the joined wheel is all that is needed now
        piece.unlink()
    return wheel


def install(folder: Path, target: Path) -> int:
    """One call of the plan (out/call-N, carried): its wheels go into `target` where this
    machine lacks the package or runs a version the run refuses; the image's own serve
    otherwise. Parts of a wheel cut over the calls wait in target/.gpu_rehearsal until the one
    with its last part comes. A call after the first stops at once when an earlier one's
    install is not there: the machine was given back between the calls."""
    call = read_json(folder / CALL_FILE)
    expected = read_json(folder / VERSIONS_FILE)
    state = target / ".gpu_rehearsal"
    for earlier in range(1, call["call"]):
        done = state / f"call-{earlier}.json"
        if not done.is_file() or read_json(done)["plan"] != call["plan"]:
            raise SystemExit(
                f"install: call {earlier} of this plan has not installed into {target} on this "
                f"machine (a machine goes back 30 s after a call): make call {earlier} again, "
                f"then call {call['call']} right after it"
            )
    (state / "parts").mkdir(parents=True, exist_ok=True)
    wheels = [folder / "wheels" / name for name in call["wheels"]]
    for part in call["parts"]:
        shutil.copyfile(folder / "parts" / part["file"], state / "parts" / part["file"])
        if part["last"]:
            wheels.append(join_parts(state / "parts", part, state / "joined"))
    chosen, kept = [], {}
    for wheel in wheels:
        name = canonical(wheel.name.split("-")[0])
        reason = install_reason(name, expected.get(name))
        if reason:
            chosen.append(wheel)
            log(f"install: {wheel.name} ({reason})")
        else:
            kept[name] = installed_version(name)
            log(f"install: {name}: this machine's {kept[name]} is one the run accepts")
    if chosen:
        subprocess.run(
            [
                *(sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"),
                *("--no-compile", "--upgrade", "--target", str(target), *map(str, chosen)),
            ],
            check=True,
        )
    shutil.rmtree(state / "joined", ignore_errors=True)
    write_json(
        state / f"call-{call['call']}.json",
        {"plan": call["plan"], "installed": [w.name for w in chosen], "kept": kept},
    )
    log(f"install: call {call['call']} of {call['calls']}: {len(chosen)} wheel(s) into {target}")
    return 0
