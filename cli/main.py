"""The ``sorl`` command: a thin typer front-end; all logic lives in ``sorl_monitor``."""

from __future__ import annotations

import warnings
from typing import Annotated

import typer

from sorl_monitor.cli import core, diagnose, fleet, ingest
from sorl_monitor.cli import dashboard as dashboard_cli
from sorl_monitor.cli import train as train_cli
from sorl_monitor.cli.console import fail, show_warning_in_one_line
from sorl_monitor.storage import parse_storage_options, set_default_storage_options

warnings.showwarning = show_warning_in_one_line

app = typer.Typer(
    name="sorl",
    help="sorl-monitor: see RL fine-tuning collapse coming, explain why, and stop it.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def storage(
    storage_option: Annotated[
        list[str] | None,
        typer.Option(
            "--storage-option",
            help="Object storage (s3://) setting, key=value: endpoint_override, scheme, access_key, "
            "secret_key, region, anonymous (default: the AWS environment variables). Repeatable.",
        ),
    ] = None,
) -> None:
    """sorl-monitor: see RL fine-tuning collapse coming, explain why, and stop it."""
    try:
        set_default_storage_options(parse_storage_options(storage_option))
    except ValueError as error:
        fail(str(error))


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
app.command("fleet")(fleet.fleet)
app.command("dashboard")(dashboard_cli.dashboard_command)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
