"""``sorl train``: run the bundled multi-turn trainer with a live progress bar, then print its post-mortem."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from sorl_monitor.cli.console import console, fail, require, user_errors

if TYPE_CHECKING:
    from sorl_monitor.diagnose.postmortem import Verdict

ALGO_HELP = "ppo | turn_ppo | s_ppo | so_ppo (= st_ppo) | grpo | so_grpo"


def _live_fields(fields: dict) -> str:
    """The progress bar's live text for one rollout iteration (empty during the warm start)."""
    if not fields:
        return ""
    text = f"reward {fields['reward']:.2f}  clip {fields['clip_frac']:.2f}  KL {fields['kl']:.3f}"
    return text + ("  [yellow]CTN on[/]" if fields.get("ctn") else "")


def _progress_bar() -> tuple[Progress, callable]:
    bar = Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), TextColumn("{task.fields[info]}"), console=console, transient=False,
    )  # fmt: skip
    tasks: dict[str, int] = {}

    def update(phase: str, done: int, total: int, fields: dict) -> None:
        if phase not in tasks:
            label = "warm start" if phase == "warmup" else "train"
            tasks[phase] = bar.add_task(label, total=total, info="")
        bar.update(tasks[phase], completed=done, info=_live_fields(fields))

    return bar, update


@user_errors
def train_command(
    algo: Annotated[str | None, typer.Option(help=ALGO_HELP)] = None,
    ctn: Annotated[str | None, typer.Option(help="off | on | auto (default: the algorithm's own)")] = None,
    seed: Annotated[
        int | None, typer.Option(help="Seed of the model, the questions and the sampling.")
    ] = None,
    steps: Annotated[
        int | None,
        typer.Option(
            "--steps", "--iterations", help="Rollout iterations (each = epochs × minibatches updates)."
        ),
    ] = None,
    log_dir: Annotated[str | None, typer.Option(help="Where runs are written (default runs/).")] = None,
    run_name: Annotated[str | None, typer.Option(help="Run id (default: date-time-algo-hex).")] = None,
    log_turns: Annotated[
        str | None, typer.Option(help="all | first | none: which updates write turn rows.")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", help="TOML file of TrainConfig fields ([task], [policy], [detectors] tables)."
        ),
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            help="Any TrainConfig field: name=value, e.g. lr=5e-4, anneal_lr=true, task.max_hops=2, "
            "detectors.clip_rise_warning=4 (repeatable; docs/trainer.md lists them).",
        ),
    ] = None,
    quiet: Annotated[bool, typer.Option("--quiet", help="No progress bar.")] = False,
) -> None:
    """Train the bundled multi-turn search agent; every update is logged through the monitor.

    The config file, then --set, then the named options. Exit status: 0 healthy, 3 collapsed, 2 bad input.
    """
    require("torch", "trainer")
    from sorl_monitor.diagnose.postmortem import postmortem
    from sorl_monitor.read.query import open_runs
    from sorl_monitor.trainer.config import TrainConfig, load_config, with_settings
    from sorl_monitor.trainer.train import train

    cfg = load_config(config) if config is not None else TrainConfig()
    named = {"algo": algo, "ctn": ctn, "seed": seed, "iterations": steps, "log_dir": log_dir,
             "run_name": run_name, "log_turns": log_turns}  # fmt: skip
    cfg = with_settings(cfg, [*(set_ or []), *(f"{k}={v}" for k, v in named.items() if v is not None)])
    cfg.check()
    if cfg.run_name is not None and (Path(cfg.log_dir) / cfg.run_name).exists():
        fail(f"run {cfg.run_name!r} already exists in {cfg.log_dir}; pick another --run-name")
    console.print(f"training [bold]{cfg.algo}[/] (CTN {cfg.ctn_mode}, seed {cfg.seed}, lr {cfg.lr:g}"
                  f"{' annealed' if cfg.anneal_lr else ''}, "
                  f"{cfg.epochs}×{cfg.minibatches} reuse, staleness {cfg.staleness}) → {cfg.log_dir}/")  # fmt: skip
    try:
        if quiet:
            result = train(cfg)
        else:
            bar, update = _progress_bar()
            with bar:
                result = train(cfg, progress=update)
    except KeyboardInterrupt:
        fail(
            f"interrupted; what was logged so far is in {cfg.log_dir}/ (run.json status: interrupted)",
            code=130,
        )
    for step, _on, reason in result.ctn_switches:
        console.print(f"  update {step}: {reason}", highlight=False)
    with open_runs(result.run_dir) as runs:
        verdict = postmortem(runs, result.run_id)
    state = (
        "[red]collapsed[/] at update " + str(verdict.collapse_step)
        if verdict.collapsed
        else "[green]no collapse[/]"
    )
    console.print(
        f"{result.run_id}: {result.status}, {state}; reward peak {result.peak_reward:.2f}, "
        f"final {result.final_reward:.2f}"
        + (f"; root cause {verdict.root_cause}" if verdict.collapsed else "")
        + f" ({result.seconds:.0f} s)"
    )
    console.print(f"  details: sorl postmortem {result.run_dir}", highlight=False)
    raise typer.Exit(3 if verdict.collapsed else 0)


DEMO_RUNS = {
    "token-ppo": ({"algo": "ppo"}, "token-level PPO, no CTN"),
    "so-ppo-auto-ctn": (
        {"algo": "so_ppo", "ctn": "auto"},
        "SO-PPO (turn-level IS), CTN on from the start, then switched by the live detectors",
    ),
    "ppo-auto-ctn": (
        {"algo": "ppo", "ctn": "auto"},
        "the same token PPO, CTN on from the start, then switched by the live detectors",
    ),
}
"""The demo's runs: name → (TrainConfig fields, what it is)."""


def alarm_and_lead(verdict: Verdict) -> tuple[str, str]:
    """The demo table's alarm and lead cells: the alert the post-mortem counts the lead from (of a run that did
    not fall, its first critical alert), as ``sorl postmortem`` and the dashboard show it."""
    alarm = verdict.streak_first_critical if verdict.fall_step is not None else verdict.first_critical
    return _fmt(alarm), _fmt(verdict.lead_time)


def _fmt(value, digits: int = 2) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


@user_errors
def demo_command(
    log_dir: Annotated[str, typer.Option(help="Where the demo runs are written.")] = "demo_runs",
    steps: Annotated[int, typer.Option("--steps", "--iterations", help="Rollout iterations per run.")] = 100,
    seed: Annotated[int, typer.Option(help="Seed of every run.")] = 0,
) -> None:
    """Train token PPO, SO-PPO with auto-CTN and PPO with auto-CTN (all at once), then compare their post-mortems."""
    import shutil

    from rich.table import Table

    require("torch", "trainer")
    from sorl_monitor.cli.diagnose import lead_words
    from sorl_monitor.diagnose.postmortem import postmortem
    from sorl_monitor.read.query import open_runs
    from sorl_monitor.trainer.config import TrainConfig
    from sorl_monitor.trainer.parallel import train_many

    configs = {
        name: TrainConfig(seed=seed, iterations=steps, log_dir=log_dir, run_name=name, **fields)
        for name, (fields, _) in DEMO_RUNS.items()
    }
    for name in DEMO_RUNS:
        shutil.rmtree(Path(log_dir) / name, ignore_errors=True)  # the demo's own previous runs
    cfg = next(iter(configs.values()))
    decay = " decayed linearly to 0" if cfg.anneal_lr else ""
    console.print(f"Real trainings on the multi-turn search task, seed {seed}, the same off-policy setting: "
                  f"lr {cfg.lr:g}{decay}, {cfg.epochs} epochs × {cfg.minibatches} mini-batches per rollout batch, "
                  f"rollouts {cfg.staleness} iterations stale, {steps} iterations ({steps * cfg.epochs * cfg.minibatches} "
                  "updates) each:")  # fmt: skip
    for name, (_, what) in DEMO_RUNS.items():
        console.print(f"  {name:<16} {what}", highlight=False)
    console.print()
    bar = Progress(
        TextColumn("[bold]{task.description:<16}"), TextColumn("{task.fields[phase]:<10}"), BarColumn(),
        MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("{task.fields[info]}"), console=console,
    )  # fmt: skip
    tasks = {name: bar.add_task(name, total=None, phase="waiting", info="") for name in configs}

    def report(name: str, phase: str, done: int, total: int, fields: dict) -> None:
        if phase in ("warmup", "train"):
            bar.update(tasks[name], completed=done, total=total, phase="warm start" if phase == "warmup" else "RL",
                       info=_live_fields(fields))  # fmt: skip
        elif phase == "done":
            bar.update(tasks[name], phase="done")
        else:
            bar.update(tasks[name], phase="[red]failed[/]", info=fields.get("error", ""))

    try:
        with bar:
            # all at once: on 2 cores three one-thread runs end together after 1.5 runs' time; two at a
            # time, the third trained alone on one core after the first two (2 runs' time)
            results = train_many(configs, report, jobs=len(configs))
    except KeyboardInterrupt:
        fail(f"interrupted; the runs so far are in {log_dir}/", code=130)
    failed = {name: r["error"] for name, r in results.items() if "error" in r}
    if failed:
        fail("; ".join(f"{name}: {error}" for name, error in failed.items()), code=1)
    for name in DEMO_RUNS:
        for step, _, reason in results[name]["switches"][:3]:
            console.print(f"{name}, update {step}: {reason}", highlight=False)
    table = Table(title="Post-mortems")
    for column in ("run", "peak", "final", "collapse", "alarm", "lead", "CTN on"):
        table.add_column(column, no_wrap=True)
    remedies, causes, warned = {}, {}, {}
    for name in DEMO_RUNS:
        result = results[name]
        with open_runs(result["run_dir"]) as runs:
            verdict = postmortem(runs, result["run_id"])
            share = runs.sql(
                "SELECT avg(CASE WHEN ctn_active THEN 1.0 ELSE 0.0 END) AS s FROM steps"
            ).to_pylist()
        collapse = f"at {verdict.collapse_step}" if verdict.collapsed else "no"
        table.add_row(name, _fmt(result["peak"]), _fmt(result["final"]), collapse, *alarm_and_lead(verdict),
                      f"{share[0]['s']:.0%}")  # fmt: skip
        remedies[name], causes[name] = verdict.remedy, verdict.root_cause
        if verdict.fall_step is not None:
            warned[name] = lead_words(verdict)
    console.print(table)
    console.print("(reward per rollout batch; final = mean of the last 5; steps are updates; alarm = the first "
                  "critical alert of the streak into the fall (of a run that did not fall: its first critical alert), "
                  "lead = fall start - alarm, as `sorl postmortem` and the dashboard tell it. "
                  "Collapse = the label: "
                  "reward moving average below half its peak for 64+ steps.)",
                  highlight=False)  # fmt: skip
    for name, cause in causes.items():
        if cause:
            console.print(
                f"Root cause of {name}'s collapse: {cause} ({warned.get(name, '')})", highlight=False
            )
    if remedies["token-ppo"]:
        console.print(f"Remedy suggested for token-ppo: {remedies['token-ppo']}", highlight=False)
    console.print("One seed is one outcome: experiments/collapse_sweep.py measures rates over seeds (README, "
                  "'Bundled trainer').", highlight=False)  # fmt: skip
    console.print(f"\nPer run:             .venv/bin/sorl postmortem {log_dir}/token-ppo\n"
                  f"Open the dashboard:  .venv/bin/sorl dashboard {log_dir}   (then http://127.0.0.1:8501)\n"
                  f"HTML report:         .venv/bin/sorl report {log_dir} --html {log_dir}/report.html",
                  highlight=False)  # fmt: skip
