"""A training loop logging to object storage until it is killed (``python -m tests.helpers.s3_child URI``)."""

from __future__ import annotations

import sys

from tests.helpers.s3_ranks import log_updates

if __name__ == "__main__":
    log_updates(sys.argv[1], "killed-run", rank=0, world_size=1, updates=100_000, flush_interval_s=0.05)
