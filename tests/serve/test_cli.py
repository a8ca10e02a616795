"""The server's command line and environment (sqlrl/serve/cli.py): `sqlrl.serve:app` built from
SQLRL_* variables without loading a model, and every flag described with its variable."""

from __future__ import annotations

import pytest


def test_module_app_is_built_from_env_without_loading_a_model(monkeypatch, trained):
    import sqlrl.serve as serve
    from sqlrl.serve.cli import build_parser, config_from_env

    monkeypatch.setenv("SQLRL_MODEL", str(trained))
    monkeypatch.setenv("SQLRL_MAX_BATCH_SIZE", "3")
    monkeypatch.setenv("SQLRL_WARMUP", "false")
    monkeypatch.setattr(serve, "_app", None)
    app = serve.app
    service = app.state.service
    assert service.config.model == str(trained) and service.config.max_batch_size == 3
    assert service.config.warmup is False and service.backend is None  # loaded at startup
    args = build_parser().parse_args(["--model", "m", "--port", "9", "--max-new-tokens", "7"])
    assert (args.model, args.port, args.max_new_tokens, args.max_batch_size) == ("m", 9, 7, 3)
    with pytest.raises(SystemExit, match="SQLRL_MAX_QUEUE"):
        config_from_env({"SQLRL_MAX_QUEUE": "many"})
    assert serve.main(["--model", str(trained / "absent")]) == 2


def test_every_serve_flag_is_described_with_its_environment_variable():
    """`serve --help` says what each flag does (not its own name again) and which SQLRL_*
    variable sets it."""
    from sqlrl.serve.cli import build_parser

    for action in build_parser()._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = action.option_strings[0]
        words = flag.lstrip("-").replace("-", " ")
        assert action.help and action.help.split(" [")[0] != words, flag
        if action.dest != "log_level":
            assert f"[SQLRL_{action.dest.upper()}]" in action.help, flag
