"""Databases the server and TextToSQL ask by URL (`postgresql://...`, `sqlite:///path`):
connections read-only by construction (databases.py), the refusal list checked before a query
runs (refusals.py), and the SQLite -> PostgreSQL converter the tests load Spider with.

A package of its own, outside sqlrl/sql: the pipeline's stages depend on sqlrl/sql, and
serving a live database is no input of training or evaluation (dvc.yaml's deps follow the
imports, so a change here reruns no stage)."""
