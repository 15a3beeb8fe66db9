"""The fleet of replicated sample runs that ``benchmarks/bench_dashboard.py --fleet-runs`` measures
(``benchmarks/fleet_runs.py``), so the tests open the same fleet."""

from __future__ import annotations

from tests.helpers.benchmark_code import load

_fleet_runs = load("fleet_runs")
make_fleet = _fleet_runs.make_fleet
sample_runs = _fleet_runs.sample_runs
replicate = _fleet_runs.replicate
