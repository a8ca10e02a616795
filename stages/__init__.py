"""Thin DVC entry points: `python -m stages.<name>` reads params, calls sqlrl, writes outputs."""
