"""The ``sorl`` command: a thin typer front-end; all logic lives in ``sorl_monitor``."""

from __future__ import annotations

import warnings

import typer

from sorl_monitor.cli import core, diagnose, ingest
from sorl_monitor.cli import dashboard as dashboard_cli
from sorl_monitor.cli import train as train_cli
from sorl_monitor.cli.common import show_warning_in_one_line

warnings.showwarning = show_warning_in_one_line

app = typer.Typer(
    name="sorl",
    help="sorl-monitor: see RL fine-tuning collapse coming, explain why, and stop it.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

app.command("train")(train_cli.train_command)
app.command("demo")(train_cli.demo_command)
app.command("runs")(core.runs)
app.command("query")(core.query)
app.command("summary")(core.summary)
app.command("ingest")(ingest.ingest)
app.command("postmortem")(diagnose.postmortem)
app.command("report")(diagnose.report)
app.command("compare")(diagnose.compare)
app.command("watch")(diagnose.watch)
app.command("dashboard")(dashboard_cli.dashboard_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
