"""Score the verdicts on the real dev set: the team's own (``experiments/real_logs/``, its manifest) and the
shared one (``../shared/real_logs/``), against labels fixed before any verdict was looked at
(``experiments/real_logs/LABEL_RULE.md``).

    python experiments/real_eval.py [--manifest experiments/real_logs/manifest.jsonl] [--shared ../shared/real_logs]
                                    [--json out.json]

For each labelled run (a file, a run in a multi-run export, or a segment of a restarted log):

* **collapsed**: *flagged* when the post-mortem of the whole log exits non-zero and, judged on the log cut at
  the label's alarm-by step (fall start + 2 logged rows), it already exits non-zero or its first critical
  alert is at or before alarm-by (a label with no fall start: the non-zero exit alone);
* **healthy**: a *false alarm* when the post-mortem of the whole log has a critical alert or exits non-zero.

Every file must open (a verdict, or ``not_judged`` naming candidates). Files under ``local/`` (licences that do
not allow copying them into the repository) are scored where present. The table is per source (repository)
and per log shape; nothing here is fitted, so it is one out-of-sample score.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.compute as pc

from sorl_monitor.diagnose.detectors import DetectorConfig
from sorl_monitor.diagnose.postmortem import postmortem
from sorl_monitor.logs import LogWarning
from sorl_monitor.read.query import open_runs

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = ROOT / "experiments" / "real_logs" / "manifest.jsonl"
SHARED = ROOT.parent / "shared" / "real_logs"
EXIT_CODES = {"healthy": 0, "collapsed": 3, "collapsing": 4, "diverging": 5, "not_judged": 6}

SHARED_LABELS = {
    # ../shared/real_logs/README.md: the authors' experiment-status table (rho sweep) and the curve or the
    # authors for more/ (all healthy); rho0.10_seed42 is not labelled by its authors.
    "trl-grpo-qwen3.5-9b-rho-sweep/rho0.70_seed44.step_logs.json": ("collapsed", None),
    "trl-grpo-qwen3.5-9b-rho-sweep/rho0.10_seed42.step_logs.json": ("unlabelled", None),
    **{
        f"trl-grpo-qwen3.5-9b-rho-sweep/rho{rho}_seed{seed}.step_logs.json": ("healthy", None)
        for rho, seeds in (("0.70", (42, 43)), ("1.00", (42, 43, 44)), ("3.00", (42, 43, 44)))
        for seed in seeds
    },
    "more/Bihan__dstack-configs__verl_ppo_qwen2.5-7b_gsm8k.log": ("healthy", None),
    "more/Ning-Guo__hotpotqa-agent__grpo_v1.log": ("healthy", None),
    "more/HaoranLuo__text2sql-grpo__trainer_state_1000steps.json": ("healthy", None),
    "more/samyakshrestha__grpo-verified-reasoner__trainer_state_ckpt1134.json": ("healthy", None),
    "more/ShibukiZero__assignment5-alignment__final_on_policy_lr4e-5_400_metrics.jsonl": ("healthy", None),
}
"""The shared files' labels; a collapse's fall start comes from the curve rule (``real_labels``) at scoring."""


@dataclass
class Case:
    """One labelled run: where it is, its label, and what the post-mortem said."""

    source: str
    file: str
    shape: str
    run: str | None
    """The run's name in a multi-run log, or its segment number (``"2"``), else ``None``."""
    label: str
    alarm_by: int | None = None
    status: str | None = None
    first_critical: int | None = None
    cut_status: str | None = None
    judged: str | None = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> bool:
        if self.status is None or EXIT_CODES[self.status] == 0:
            return False
        if self.alarm_by is None:  # the label names no fall start: a non-zero exit is all that can be asked
            return True
        early = (
            self.first_critical is not None
            and self.alarm_by is not None
            and self.first_critical <= self.alarm_by
        )
        return early or (self.cut_status is not None and EXIT_CODES[self.cut_status] != 0)

    @property
    def false_alarm(self) -> bool:
        return self.status is not None and (EXIT_CODES[self.status] != 0 or self.first_critical is not None)


def manifest_cases(manifest: Path) -> list[Case]:
    cases = []
    for line in manifest.read_text().splitlines():
        if not line.strip():
            continue
        entry = json.loads(line)
        if entry.get("scored") is False:
            cases.append(Case(entry["repo"], entry["file"], entry["shape"], None, "opens only"))
            continue
        labels = entry["label"] if isinstance(entry["label"], list) else [entry["label"]]
        if entry.get("runs"):
            for run in entry["runs"]:
                cases.append(Case(entry["repo"], entry["file"], entry["shape"], run["run"], run["label"],
                                  run.get("alarm_by")))  # fmt: skip
        elif entry.get("segments"):
            for segment, label in zip(entry["segments"], labels, strict=True):
                alarm = segment.get("alarm_by") if isinstance(segment, dict) else None
                cases.append(
                    Case(entry["repo"], entry["file"], entry["shape"], str(segment["segment"]), label, alarm)
                )
        else:
            cases.append(
                Case(entry["repo"], entry["file"], entry["shape"], None, labels[0], entry.get("alarm_by"))
            )
    return cases


def shared_cases(shared: Path) -> list[Case]:
    from real_labels import label_curve  # the curve rule, for the shared collapse's fall start

    cases = []
    for file, (label, alarm) in SHARED_LABELS.items():
        source = (
            "Sunshine535/nips-grpo-dynamics" if file.startswith("trl-") else file.split("/")[1].split("__")[0]
        )
        shape = "hf-log-history" if file.endswith(".json") else Path(file).suffix.lstrip(".")
        if label == "collapsed" and (shared / file).is_file():
            rows = [r for r in json.loads((shared / file).read_text()) if "reward" in r]
            alarm = label_curve([r["step"] for r in rows], [r["reward"] for r in rows], lo=0).alarm_by
        cases.append(Case(source, str(Path("../shared/real_logs") / file), shape, None, label, alarm))
    return cases


def run_id_for(runs, case: Case) -> str | None:
    ids = sorted(runs.foreign)
    if case.run is None:
        return ids[0] if len(ids) == 1 else None
    if case.run.isdigit():
        matches = [i for i in ids if i.endswith(f"+{case.run}")]
    else:
        matches = [i for i in ids if i == case.run or i.endswith(case.run)]
    return matches[0] if len(matches) == 1 else None


def labelled_cases(manifest: Path, shared: Path) -> list[Case]:
    """The manifest's cases, then the shared files' (when the shared folder is there)."""
    return manifest_cases(manifest) + (shared_cases(shared) if shared.is_dir() else [])


def path_of(case: Case, manifest: Path, shared: Path) -> Path | None:
    """Where a case's file is here, or ``None`` (with ``case.error`` saying so) when it is absent."""
    if case.file.startswith("../shared/real_logs/"):
        path = shared / case.file[len("../shared/real_logs/") :]
    else:
        path = manifest.parent / case.file
    if not path.exists():
        case.error = "absent (not committed: its licence does not allow a copy)"
        return None
    return path


def judge(case: Case, path: Path, config: DetectorConfig | None = None) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LogWarning)
        try:
            with open_runs(path) as runs:
                if case.label == "opens only":
                    return
                run_id = run_id_for(runs, case)
                if run_id is None:
                    case.error = (
                        f"no run matches {case.run!r} (runs: {', '.join(sorted(runs.foreign))[:200]})"
                    )
                    return
                verdict = postmortem(runs, run_id, config)
                case.status, case.first_critical = verdict.status, verdict.first_critical
                case.judged = ((runs.foreign[run_id].info.get("config") or {}).get("judged") or {}).get(
                    "column"
                )
                if case.label == "collapsed" and case.alarm_by is not None:
                    run = runs.foreign[run_id]
                    run.steps = run.steps.filter(pc.less_equal(run.steps.column("step"), case.alarm_by))
                    runs.views.show_parts(
                        "steps", tuple(runs.catalog.parts("steps")), list(runs.foreign.values())
                    )
                    case.cut_status = postmortem(runs, run_id, config).status
        except Exception as error:  # noqa: BLE001 - a file that does not open is a result, not a crash
            case.error = f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"


def table(cases: list[Case], key) -> list[str]:
    groups: dict[str, list[Case]] = defaultdict(list)
    for case in cases:
        groups[key(case)].append(case)
    lines = ["| group | runs that open | collapses flagged | healthy with an alarm |", "|---|---|---|---|"]
    for name in sorted(groups):
        lines.append(_row(name, groups[name]))
    lines.append(_row("**all**", cases))
    return lines


def _row(name: str, cases: list[Case]) -> str:
    opened = [c for c in cases if c.error is None]
    collapsed = [c for c in opened if c.label == "collapsed"]
    healthy = [c for c in opened if c.label == "healthy"]
    return (f"| {name} | {len(opened)}/{len(cases)} | {sum(c.flagged for c in collapsed)}/{len(collapsed)} | "
            f"{sum(c.false_alarm for c in healthy)}/{len(healthy)} |")  # fmt: skip


def manifest_markdown(manifest: Path) -> str:
    """``MANIFEST.md``: one row per file of the manifest (written by ``--write-manifest``)."""
    lines = [
        "# The team's real dev set",
        "",
        "Public logs of real LLM RL fine-tuning, copied byte for byte (`git show COMMIT:PATH`, the git blob id",
        "checked), labelled by `LABEL_RULE.md` before any verdict was looked at. `manifest.jsonl` is the source of",
        "this table (authors' words, notes, per-run labels of multi-run files); `experiments/real_eval.py` scores",
        "them. Files whose repository has no licence that allows a copy are not committed (`local/`, git-ignored):",
        "their entries stay, scored where a copy is present.",
        "",
        "| file | repo @ commit : path | blob | licence | trainer, model | shape | rows | label (basis) | fall start → alarm-by |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for line in manifest.read_text().splitlines():
        e = json.loads(line)
        label = e["label"] if not isinstance(e["label"], list) else ", ".join(map(str, e["label"]))
        if e.get("runs"):
            label = ", ".join(f"{r['run']}: {r['label']}" for r in e["runs"])
        if e.get("scored") is False:
            label += " — opened, not scored: " + e.get("scored_why", "")
        when = f"{e.get('fall_start')} → {e.get('alarm_by')}" if e.get("alarm_by") is not None else ""
        where = f"{e['repo']} @{e['commit'][:12]} : {e['path']}"
        name = e["file"] if e.get("committed") else f"{e['file']} (not committed)"
        cells = [name, where, e["blob"][:12], e["licence"], f"{e['trainer']}; {e['model']}", e["shape"].split(" (")[0],
                 str(e.get("rows")), f"{label} ({e.get('label_basis')})", when]  # fmt: skip
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--manifest", type=Path, default=MANIFEST)
    parser.add_argument("--shared", type=Path, default=SHARED)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument(
        "--set", action="append", default=[], help="a detector setting name=value (repeatable)"
    )
    parser.add_argument(
        "--write-manifest", action="store_true", help="write MANIFEST.md from the manifest, then stop"
    )
    args = parser.parse_args(argv)
    if args.write_manifest:
        (args.manifest.parent / "MANIFEST.md").write_text(manifest_markdown(args.manifest))
        return 0
    sys.path.insert(0, str(Path(__file__).parent))
    cases = manifest_cases(args.manifest) + (shared_cases(args.shared) if args.shared.is_dir() else [])
    absent = 0
    for case in cases:
        path = (
            (args.manifest.parent / case.file)
            if not case.file.startswith("../")
            else args.shared / case.file[len("../shared/real_logs/") :]
        )
        if not path.exists():
            case.error, absent = "absent (not committed: its licence does not allow a copy)", absent + 1
            continue
        judge(case, path)
    present = [c for c in cases if not (c.error or "").startswith("absent")]
    files = len({c.file for c in present})
    counts = {
        label: sum(c.label == label for c in present) for label in ("collapsed", "healthy", "unlabelled")
    }
    print(f"# Real dev set: {files} files here, {len(present)} runs ({counts['collapsed']} collapsed, "
          f"{counts['healthy']} healthy, {counts['unlabelled']} unlabelled, the rest opened only); "
          f"{absent} runs absent (not committed)\n")  # fmt: skip
    print("By source:\n")
    print("\n".join(table(present, lambda c: c.source)))
    print("\nBy log shape:\n")
    print("\n".join(table(present, lambda c: c.shape.split(" ")[0])))
    print("\nEach run:\n")
    for case in present:
        what = case.error or (f"{case.status}; first critical {case.first_critical}; cut at {case.alarm_by}: "
                              f"{case.cut_status}; judged by {case.judged}")  # fmt: skip
        mark = "" if case.error else (" FLAGGED" if case.label == "collapsed" and case.flagged else
                                      " MISSED" if case.label == "collapsed" else
                                      " FALSE ALARM" if case.label == "healthy" and case.false_alarm else "")  # fmt: skip
        print(f"- {Path(case.file).name}{'#' + case.run if case.run else ''} [{case.label}]{mark}: {what}")
    if args.json:
        args.json.write_text(json.dumps([case.__dict__ for case in cases], indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
