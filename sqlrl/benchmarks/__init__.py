"""The benchmark families the pipeline scores by, each in its own module, and their registry.

    spider.py  Spider (and Spider-DK, Spider-Syn, a user's set in its format): test-suite EX,
               EM, hardness
    bird.py    BIRD: EX on result sets, Soft-F1, difficulty
    base.py    what a family is (`Benchmark`), for a new one to subclass
    sets.py    an evaluation set of params' eval.sets read by its family's fields, and its rows

The registry is where a family's name (eval.sets[...].format in params, a prediction row's
`format`) becomes its object: params take their allowed formats from it, and the stages and
the score command look a name up here once, then pass the object on. Adding a family is one
module and its `register_benchmark` line below. Importing this package is cheap (sets.py, which
builds prompts, is not imported here), so sqlrl.params can import it.
"""

from __future__ import annotations

from sqlrl.benchmarks.base import Benchmark
from sqlrl.benchmarks.bird import BIRD
from sqlrl.benchmarks.spider import SPIDER

BENCHMARKS: dict[str, Benchmark] = {}


def register_benchmark(benchmark: Benchmark) -> Benchmark:
    """Add a family under its name (a name already taken is an error)."""
    if benchmark.name in BENCHMARKS:
        raise ValueError(f"a benchmark named {benchmark.name!r} is already registered")
    BENCHMARKS[benchmark.name] = benchmark
    return benchmark


def unregister_benchmark(name: str) -> None:
    """Remove a family (a test's, after it ran)."""
    del BENCHMARKS[name]


def get_benchmark(name: str) -> Benchmark:
    """The family called `name`; a ValueError lists the known ones."""
    try:
        return BENCHMARKS[name]
    except KeyError:
        raise ValueError(
            f"unknown benchmark {name!r}: one of {', '.join(map(repr, BENCHMARKS))}"
        ) from None


def level_report_keys() -> tuple[str, ...]:
    """Each family's per-level section of a report (`by_hardness`, ...), in registry order."""
    return tuple(dict.fromkeys(f"by_{b.level_key}" for b in BENCHMARKS.values()))


register_benchmark(SPIDER)
register_benchmark(BIRD)
