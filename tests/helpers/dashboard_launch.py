"""``sorl dashboard`` run up to the point where it would start Streamlit: the command and environment it built."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from typer.testing import CliRunner

from sorl_monitor.cli import dashboard as dashboard_cli
from sorl_monitor.cli.main import app


class Launched(Exception):
    """Raised by the stand-in for ``os.execve``: the command and environment it was given."""

    def __init__(self, command: list[str], env: dict[str, str]) -> None:
        super().__init__("launched")
        self.command, self.env = command, env


def stub_launch(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Launched]:
    """A function running ``sorl dashboard ARGS`` with ``os.execve`` stubbed; it returns the launch."""

    def fake_execve(path: str, command: list[str], env: dict[str, str]) -> None:
        raise Launched(command, env)

    monkeypatch.setattr(dashboard_cli.os, "execve", fake_execve)

    def run(*args: object) -> Launched:
        result = CliRunner().invoke(app, ["dashboard", *map(str, args)])
        assert isinstance(result.exception, Launched), result.output
        return result.exception

    return run
