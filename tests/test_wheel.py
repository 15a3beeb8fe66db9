"""The built wheel in a clean venv: the light core reads runs without torch, and extras add the rest.

Builds the wheel, installs it into a new virtualenv (its dependencies come from the package index), then:
``sorl --help``; a post-mortem of ``sample_logs/token-ppo`` (exit 3, a collapse) with only the light core
(duckdb, pyarrow, numpy, typer); ``sorl report`` naming the extra it needs; and, after installing the
``[dashboard]`` extra, a dashboard that answers its health check. Slow (a minute or two: installs).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOT_SOURCE = (
    ".git",
    ".venv*",
    "build",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    "test-artifacts",
    "experiments",
)
"""What the wheel is not built from: the checkout's own build state, venvs, caches and research data."""
pytestmark = pytest.mark.slow


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A clean venv with the wheel (light core only) installed; its bin folder."""
    scratch = tmp_path_factory.mktemp("wheel")
    source = scratch / "source"  # a private copy: setuptools builds in the tree (build/, *.egg-info)
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*NOT_SOURCE))
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(scratch), str(source)])
    assert built.returncode == 0, built.stderr[-2000:]
    wheel = next(scratch.glob("sorl_monitor-*.whl"))
    venv.create(scratch / "venv", with_pip=True)
    bin_dir = scratch / "venv" / "bin"
    install = run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(wheel)])
    if install.returncode != 0:
        pytest.skip(f"the package index is out of reach here: {install.stderr.strip().splitlines()[-1]}")
    return bin_dir


def test_the_light_core_installs_no_torch_no_dashboard(installed):
    listed = run([str(installed / "python"), "-m", "pip", "list", "--format", "json"])
    names = {row["name"].lower() for row in json.loads(listed.stdout)}
    assert {"sorl-monitor", "duckdb", "pyarrow", "typer"} <= names
    assert not names & {"torch", "transformers", "streamlit", "plotly"}
    top_level = {p.name for p in next((installed.parent / "lib").glob("python*/site-packages")).iterdir()}
    assert "sorl_monitor" in top_level and not {"cli", "dashboard"} & top_level


def test_sorl_help_and_a_postmortem_run_on_the_light_core(installed):
    assert run([str(installed / "sorl"), "--help"]).returncode == 0
    result = run([str(installed / "sorl"), "postmortem", str(ROOT / "sample_logs" / "token-ppo"), "--json"])
    assert result.returncode == 3, result.stderr
    assert json.loads(result.stdout)["status"] == "collapsed"


def test_a_command_that_needs_an_extra_names_it_in_one_line(installed, tmp_path):
    result = run(
        [str(installed / "sorl"), "report", str(ROOT / "sample_logs"), "--html", str(tmp_path / "r.html")]
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "error: this command needs plotly: pip install 'sorl-monitor[dashboard]'"


def test_with_the_dashboard_extra_the_dashboard_answers_its_health_check(installed):
    wheel = next(installed.parents[1].glob("sorl_monitor-*.whl"))
    extra = run([str(installed / "python"), "-m", "pip", "install", "--quiet", f"{wheel}[dashboard]"])
    assert extra.returncode == 0, extra.stderr[-2000:]
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(
        [str(installed / "sorl"), "dashboard", str(ROOT / "sample_logs"), "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline, answer = time.monotonic() + 90, None
        while time.monotonic() < deadline and answer is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2) as response:
                    answer = response.read().decode()
            except OSError:
                time.sleep(0.5)
        assert answer == "ok"
    finally:
        server.terminate()
        server.wait(timeout=30)
