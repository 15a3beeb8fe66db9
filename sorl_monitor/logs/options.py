"""What a user tells the readers that a log does not say: which logged name is which signal, ``logging_steps``.

    options = LogOptions.build(["reward=train_reward", "entropy=token_entropy"], logging_steps=20)
    read_log("metrics.jsonl", options=options)

``--map COLUMN=NAME`` (repeatable; ``[map]`` in a TOML config: ``reward = "train_reward"``) fills the ``steps``
column ``COLUMN`` with the metric the log calls ``NAME``, after the readers' own name tables: ``COLUMN`` is a
``steps`` column (``reward_mean``, ``entropy``, ``kl_ref``, …) or one of ``ALIASES`` (``reward`` →
``reward_mean``); ``NAME`` is the name as logged (its snake-cased column, or the column a name table gave
it, is found too). The logged column stays as well. A name that no log read has is an error.
``logging_steps`` (``--logging-steps``; ``[logs] logging_steps`` in the config) numbers the printed dicts of a
Hugging Face console log (``hf_console``).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from sorl_monitor.logs.table import ForeignRun
from sorl_monitor.metric_names import names_for
from sorl_monitor.schema import STEP_METRICS, column_name

ALIASES = {
    "reward": "reward_mean",
    "length": "response_len_mean",
    "kl": "kl_ref",
    "clip": "clip_frac_active",
    "truncated": "completion_truncated_frac",
}
"""Short names ``--map`` takes for the columns the verdict's detectors read most."""
MAP_TABLE = "map"
LOGS_TABLE = "logs"


@dataclass(frozen=True)
class LogOptions:
    """What the readers are told: ``names`` (steps column → logged name) and ``logging_steps``."""

    names: tuple[tuple[str, str], ...] = ()
    logging_steps: int | None = None

    @classmethod
    def build(
        cls,
        assignments: Iterable[str] = (),
        logging_steps: int | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> LogOptions:
        """From ``--map`` items and ``--logging-steps``, over a TOML config's ``[map]`` and ``[logs]`` tables
        (``config_tables``); ``ValueError`` (one line) for a bad item."""
        config = config or {}
        names = {target: name for target, name in parse_map_table(config.get(MAP_TABLE, {})).items()}
        names.update(parse_map(assignments))
        if logging_steps is None:
            logging_steps = config.get(LOGS_TABLE, {}).get("logging_steps")
        if logging_steps is not None and (
            isinstance(logging_steps, bool) or not isinstance(logging_steps, int) or logging_steps < 1
        ):
            raise ValueError(f"logging_steps must be a positive integer, not {logging_steps!r}")
        return cls(tuple(names.items()), logging_steps)


def target_column(target: str) -> str:
    """The ``steps`` column a ``--map`` target names; ``ValueError`` when it names none."""
    column = ALIASES.get(target.strip(), target.strip())
    if column not in STEP_METRICS:
        raise ValueError(
            f"--map {target}=…: {target!r} is not a steps column "
            f"(one of {', '.join(ALIASES)}, or a column of docs/schema.md such as entropy, kl_ref)"
        )
    return column


def parse_map(assignments: Iterable[str]) -> dict[str, str]:
    """``["reward=train_reward"]`` → ``{"reward_mean": "train_reward"}``."""
    names = {}
    for item in assignments:
        target, sep, name = item.partition("=")
        if not sep or not target.strip() or not name.strip():
            raise ValueError(f"--map takes column=logged_name, not {item!r}")
        names[target_column(target)] = name.strip()
    return names


def parse_map_table(table: Any) -> dict[str, str]:
    """A TOML ``[map]`` table (``reward = "train_reward"``) as ``parse_map`` reads it."""
    if not isinstance(table, dict) or not all(isinstance(v, str) for v in table.values()):
        raise ValueError('[map] must be a table of column = "logged name"')
    return parse_map(f"{target}={name}" for target, name in table.items())


def config_tables(path: str | Path | None) -> dict[str, Any]:
    """The ``[map]`` and ``[logs]`` tables of a TOML config (empty when absent or no file is given)."""
    if path is None:
        return {}
    try:
        document = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"no such config file: {path}") from None
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"bad TOML in {path}: {error}") from None
    return {key: document[key] for key in (MAP_TABLE, LOGS_TABLE) if key in document}


def source_column(run: ForeignRun, name: str) -> str | None:
    """The column of ``run.steps`` holding the metric the log calls ``name``: the name itself, its
    snake-cased column, or the column the run's name table maps it to."""
    present = set(run.steps.column_names)
    for candidate in (name, column_name(name), names_for(run.family).get(name) if run.family else None):
        if candidate is not None and candidate in present:
            return candidate
    return None


def apply_names(run: ForeignRun, names: Iterable[tuple[str, str]]) -> set[str]:
    """Fill each target column of ``run.steps`` from the column its logged name is in (in place); the logged
    names found."""
    found = set()
    for target, name in names:
        column = source_column(run, name)
        if column is None:
            continue
        found.add(name)
        if column == target:
            continue
        values = run.steps.column(column)
        if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
            raise ValueError(f"--map {target}={name}: {name!r} holds {values.type} values, not numbers")
        values = values.cast(pa.float64())
        steps = run.steps
        if target in steps.column_names:
            steps = steps.set_column(steps.column_names.index(target), target, values)
        else:
            steps = steps.append_column(target, values)
        run.steps = steps
    return found
