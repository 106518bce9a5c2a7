"""Sampling profiles of the stack's hot paths with py-spy (pinned in requirements/dev.in).

py-spy attaches to running processes from outside (ptrace), so the product runs unmodified. Each
profile is written in py-spy's raw "collapsed stack" format under artifacts/bench/profiles/ and
summarised here: the share of samples spent in (inclusive) and on (own) each frame.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = str(Path(__file__).resolve().parents[1])
# Frames from these paths are the project's; the rest is Django, DRF, Celery, kombu, psycopg ...
PROJECT_MARKERS = ("messaging/", "ingestion/", "pilot_status/", "bench/baseline/")


def py_spy() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


def record(pids: list[int], seconds: float, out: Path, gil: bool = False) -> list[subprocess.Popen[bytes]]:
    """Start one py-spy per pid (children included); returns the running samplers. With `gil`, only threads holding
    the GIL are sampled: the Python CPU, not the waits on Postgres, Redis or a socket (py-spy counts psycopg's wait
    as busy)."""
    tool = py_spy()
    if tool is None:
        return []
    out.parent.mkdir(parents=True, exist_ok=True)
    procs = []
    for pid in pids:
        target = out.with_name(f"{out.stem}-{pid}.txt")
        procs.append(subprocess.Popen(
            [tool, "record", "--pid", str(pid), "--duration", str(max(1, int(seconds))), "--format", "raw",
             "--output", str(target), "--subprocesses", "--nonblocking", "--rate", "200", *(["--gil"] if gil else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        ))
    return procs


def finish(procs: list[subprocess.Popen[bytes]], timeout: float = 60) -> None:
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()


def _short(frame: str) -> str:
    # py-spy raw frames look like "function (/abs/path/file.py:123)": keep the function and a short path.
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", f"{ROOT}/"):
        if marker in path:
            return f"{name} ({path.split(marker, 1)[1]})"
    return f"{name} ({'/'.join(path.split('/')[-2:])})"


def summarise(files: list[Path], top: int = 15) -> dict[str, Any]:
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total = 0
    for file in files:
        if not file.exists():
            continue
        for line in file.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            frames = [f for f in stack.split(";") if f and not f.startswith(("process ", "thread "))]
            if not frames:
                continue
            total += count
            own[_short(frames[-1])] += count
            for frame in {_short(f) for f in frames}:
                inclusive[frame] += count
    project = Counter({k: v for k, v in inclusive.items() if any(m in k for m in PROJECT_MARKERS)})

    def rows(counter: Counter[str]) -> list[tuple[str, float]]:
        return [(frame, round(100 * n / total, 1)) for frame, n in counter.most_common(top)] if total else []

    return {"samples": total, "own": rows(own), "project_inclusive": rows(project), "inclusive": rows(inclusive)}
