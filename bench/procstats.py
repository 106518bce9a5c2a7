"""CPU and memory of the stack's processes, read from /proc (Linux only, no extra package).

A process kind (web, worker, ...) is a process tree: gunicorn's master and its workers, Celery's
parent and its prefork children. RSS is reported per process (the target is per process), CPU
as the sum over the tree.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Self

TICKS = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """pid and all its descendants that are alive now."""
    found: list[int] = []
    todo = [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue
    return found


def _server_kind(argv: list[str]) -> str | None:
    program = argv[0] if argv else ""
    if program.endswith("/postgres") and "-D" in argv:
        return "postgres"  # the postmaster: its tree holds every backend
    if program.endswith("beam.smp"):
        return "rabbitmq"
    if program.startswith("redis-server"):
        return "redis"
    return None


def server_roots() -> dict[str, list[int]]:
    """Root pids of the Postgres, RabbitMQ and Redis servers. On a shared machine another clone's
    servers would be counted too: run the bench on a quiet machine."""
    roots: dict[str, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        kind = _server_kind(argv)
        if kind is not None:
            roots.setdefault(kind, []).append(int(entry.name))
    return roots


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def cpu_seconds(pids: Iterable[int]) -> float:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / TICKS


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        pass
    return inodes


def _tcp_inodes_to(port: int) -> set[str]:
    """Inodes of this network namespace's TCP sockets connected to `port` (on any address)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            remote, state, inode = parts[2], parts[3], parts[9]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:  # ESTABLISHED
                found.add(inode)
    return found


def connections_to(roots: dict[str, list[int]], port: int) -> dict[str, int]:
    """Open TCP connections to `port` (Postgres's) held by each kind's processes, counted now."""
    wanted = _tcp_inodes_to(port)
    return {kind: sum(len(_socket_inodes(pid) & wanted) for root in pids for pid in tree(root))
            for kind, pids in roots.items()}


class _PeakSampler:
    """Calls _sample() every `interval` seconds in a background thread, and once more at the end;
    the subclass keeps each kind's peak in `self.peak`."""

    def __init__(self, interval: float):
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


class PeakConnections(_PeakSampler):
    """Samples connections_to in a background thread; keeps each kind's peak."""

    def __init__(self, roots: dict[str, list[int]], port: int, interval: float = 0.5):
        super().__init__(interval)
        self.roots, self.port = roots, port
        self.peak: dict[str, int] = {kind: 0 for kind in roots}

    def _sample(self) -> None:
        for kind, count in connections_to(self.roots, self.port).items():
            self.peak[kind] = max(self.peak[kind], count)


def machine_cpu_seconds() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine since boot, all cores."""
    parts = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = parts[3] + parts[4]
    total = sum(parts[:8])
    return (total - idle) / TICKS, total / TICKS


class Sampler(_PeakSampler):
    """Samples the RSS of every process of each kind in a background thread; keeps the peak."""

    def __init__(self, roots: dict[str, list[int]], interval: float = 0.5):
        super().__init__(interval)
        self.roots = roots
        self.peak: dict[str, float] = {kind: 0.0 for kind in roots}

    def _sample(self) -> None:
        for kind, pids in self.roots.items():
            for root in pids:
                for pid in tree(root):
                    self.peak[kind] = max(self.peak[kind], rss_mb(pid))


class CpuMeter:
    """CPU seconds per process kind (and for the whole machine) between start and stop.

    Counted per process: one that started meanwhile counts from zero; one that exited meanwhile is
    lost (a Postgres backend of a closed connection), so a kind's figure is a floor."""

    def __init__(self, roots: dict[str, list[int]]):
        self.roots = roots
        self.wall = 0.0
        self.by_kind: dict[str, float] = {}
        self.machine_busy = 0.0

    def _read(self) -> dict[str, dict[int, float]]:
        return {kind: {pid: cpu_seconds([pid]) for root in pids for pid in tree(root)} for kind, pids in self.roots.items()}

    def __enter__(self) -> CpuMeter:
        self._start = self._read()
        self._machine = machine_cpu_seconds()[0]
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        end = self._read()
        self.wall = time.monotonic() - self._t0
        self.machine_busy = machine_cpu_seconds()[0] - self._machine
        self.by_kind = {
            kind: sum(max(0.0, cpu - self._start.get(kind, {}).get(pid, 0.0)) for pid, cpu in pids.items())
            for kind, pids in end.items()
        }
