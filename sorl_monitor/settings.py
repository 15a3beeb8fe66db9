"""Settings from TOML files and ``--set name=value``: one way to read a dataclass field's value.

``DetectorConfig``, ``PostmortemConfig`` and ``TrainConfig`` take their values through ``coerce``: a TOML
value as it is (checked), or the text after ``--set name=`` converted to the field's annotated type.
``check_setting`` is the one range check of a keyword setting (the monitor's, the writer's, the notifier's,
a query's limits).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

_TRUE, _FALSE = {"true", "yes", "on", "1"}, {"false", "no", "off", "0"}


def _bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text not in _TRUE | _FALSE:
        raise ValueError(text)
    return text in _TRUE


def _int(raw: Any) -> int:
    if isinstance(raw, float) and raw.is_integer():
        return int(raw)
    if isinstance(raw, bool) or not isinstance(raw, str | int):
        raise ValueError(raw)
    return int(raw)


def _float(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, str | int | float):
        raise ValueError(raw)
    return float(raw)


def _strings(raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str):
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return tuple(str(part) for part in raw)


READERS = {"bool": _bool, "int": _int, "float": _float}
"""How a value of each annotated type is read (``tuple[...]`` fields: ``_strings``; anything else: ``str``)."""


def coerce(owner: str, name: str, kind: str, raw: Any) -> Any:
    """``raw`` as a value of the annotation ``kind`` (``int``, ``float``, ``bool``, ``str``, ``tuple[str, ...]``,
    each optionally ``| None``); ``ValueError`` naming ``owner`` and ``name`` when it cannot be read."""
    optional = kind.replace(" ", "").endswith("|None")
    base = kind.split("|")[0].strip()
    if raw is None or (optional and isinstance(raw, str) and raw.strip().lower() in ("none", "null")):
        if optional:
            return None
        raise ValueError(f"{owner} {name} cannot be empty")
    read = _strings if base.startswith("tuple") else READERS.get(base, str)
    try:
        return read(raw)
    except (TypeError, ValueError):
        raise ValueError(f"{owner} {name}: cannot read {raw!r} as {kind}") from None


def field_kinds(cls: type) -> dict[str, str]:
    """Each field of a dataclass and its annotation text."""
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def parse_assignments(assignments: Iterable[str]) -> dict[str, str]:
    """``["kl_rise_critical=20", …]`` → ``{"kl_rise_critical": "20", …}``."""
    parsed = {}
    for item in assignments:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--set takes name=value, not {item!r}")
        parsed[name.strip()] = value.strip()
    return parsed


def replace_settings(base: T, values: Mapping[str, Any], owner: str) -> T:
    """``base`` (a settings dataclass) with ``values`` read by ``coerce``; ``ValueError`` names an unknown key
    (``owner``: ``"detector setting"``, …, for the messages)."""
    kinds = field_kinds(type(base))
    unknown = sorted(set(values) - set(kinds))
    if unknown:
        raise ValueError(f"unknown {owner} {unknown[0]!r}; known settings: {', '.join(sorted(kinds))}")
    return dataclasses.replace(
        base, **{name: coerce(owner, name, kinds[name], raw) for name, raw in values.items()}
    )  # type: ignore[type-var]


def check_settings(settings: Any, owner: str) -> None:
    """A settings dataclass's ``int`` fields hold positive integers, its ``float`` fields numbers (not NaN)."""
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{owner} {f.name} must be a positive integer, not {value!r}")
        if f.type == "float" and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"{owner} {f.name} must be a number, not {value!r}")
        if f.type == "float" and math.isnan(value):
            raise ValueError(f"{owner} {f.name} must not be NaN")


def read_toml(path: str | Path, table: str) -> dict[str, Any]:
    """The settings of a TOML file: its ``[table]`` table if it has one, else its top level; ``ValueError``
    for a missing or unreadable file."""
    path = Path(path)
    try:
        document = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"no such config file: {path}") from None
    except IsADirectoryError:
        raise ValueError(f"config file is a directory: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"bad TOML in {path}: {error}") from None
    settings = document.get(table, document)
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: [{table}] must be a table of settings")
    return settings


def check_setting(
    name: str, value: object, *, above: float | None = None, least: float | None = None, integer: bool = False
) -> None:
    """``ValueError`` naming the setting unless ``value`` is a finite number (an integer where ``integer``)
    ``> above`` and ``>= least``."""
    kind = numbers.Integral if integer else numbers.Real
    ok = isinstance(value, kind) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (above is None or value > above) and (least is None or value >= least)
    if not ok:
        bound = f"> {above:g}" if above is not None else f">= {least:g}"
        raise ValueError(f"{name} must be {'an integer' if integer else 'a number'} {bound}, not {value!r}")


def check_writer_settings(
    flush_interval_s: float, flush_rows: int, max_pending_rows: int, compact_parts: int, compact_rows: int
) -> None:
    """``ValueError`` on a writer setting that cannot work (e.g. ``flush_interval_s=0`` busy-loops)."""
    check_setting("flush_interval_s", flush_interval_s, above=0)
    check_setting("flush_rows", flush_rows, least=1, integer=True)
    check_setting("max_pending_rows", max_pending_rows, least=1, integer=True)
    check_setting("compact_rows", compact_rows, least=1, integer=True)
    if compact_parts != 0:
        check_setting("compact_parts (0 turns compaction off)", compact_parts, least=2, integer=True)
