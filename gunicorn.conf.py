"""gunicorn's configuration file, read from the working directory by default (every pool of Pilot Status runs
from the repository's root: Procfile, compose, the stacks). Its only hook is prometheus_client's multiprocess
bookkeeping; everything else is on the command line (pilot_status/topology.py)."""

import os
import re
import socket
from typing import Any


def child_exit(server: Any, worker: Any) -> None:
    """A worker is gone: its live gauges' files go (pilot_status.observe names them `<host>-<pid>`). Its
    histograms stay in the directory, so their counts never go backwards."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not directory:
        return
    from prometheus_client import multiprocess

    host = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "host"  # as pilot_status.observe.HOST
    multiprocess.mark_process_dead(f"{host}-{worker.pid}", directory)
