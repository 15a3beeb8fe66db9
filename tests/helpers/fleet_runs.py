"""The fleet of replicated sample runs that ``benchmarks/bench_dashboard.py --fleet-runs`` measures
(``benchmarks/fleet_runs.py``), loaded from its file so the tests open the same fleet."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_FILE = Path(__file__).resolve().parents[2] / "benchmarks" / "fleet_runs.py"
_spec = importlib.util.spec_from_file_location("benchmarks_fleet_runs", _FILE)
assert _spec is not None and _spec.loader is not None
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)

make_fleet = _module.make_fleet
sample_runs = _module.sample_runs
replicate = _module.replicate
