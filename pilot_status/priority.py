"""Run a background process at a lower CPU priority: `exec python -m pilot_status.priority N command ...`.

On one host, the bulk lanes, the receipts and the maintenance tasks can keep every core busy, and an
OTP then waits for a CPU at each hop of its path (web → relay → broker → lane worker → Evolution).
The Procfile starts those background processes through this module, so that the OTP path (web,
relay_otp, worker_otp) runs first whenever it wants a core (bench B3: OTP p99 behind a marketing
drain went from 2.5–3.2× the idle stream to ≈ 1.5×).

`nice` alone is not enough: with the kernel's autogroups (`/proc/sys/kernel/sched_autogroup_enabled`,
on in most distributions) the scheduler first shares the CPU between sessions, and a process's own
nice only counts inside its session. honcho starts every Procfile line as a session of its own, so
the priority that counts is the session's (`/proc/<pid>/autogroup`). It is set only when this
process leads its session (hence `exec` in the Procfile): from an interactive shell it would
otherwise lower the whole terminal's session. In containers or systemd units, autogroups do not
apply; give those services a lower CPU weight instead (docker-compose.yml: `cpu_shares`). A process
outside any autogroup (its file is empty: a session the kernel never gave one, such as a container's
first) is scheduled by its own nice, which is then enough.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")
# The Procfile's `${BACKGROUND_NICE:-10}`: nice 10 weighs a tenth of nice 0 in the scheduler.
DEFAULT_BACKGROUND_NICE = 10
USAGE = "usage: python -m pilot_status.priority NICE COMMAND [ARG ...]   (NICE: 0..19, higher runs later)"


def lower(nice: int, autogroup: Path = AUTOGROUP) -> bool:
    """Lower this process's CPU priority to `nice` (never raise it), and its session's when it leads it.

    Returns whether the session's priority was set. A process that does not lead its session keeps the
    session's priority as it is and only sets its own. 0 (BACKGROUND_NICE=0) changes nothing at all: no
    nice, no autogroup, the process runs as it was started."""
    if not 0 <= nice <= 19:
        raise ValueError(f"NICE must be 0..19, got {nice}")
    if nice == 0:
        return False
    if nice > os.getpriority(os.PRIO_PROCESS, 0):
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    if os.getsid(0) != os.getpid() or not autogroup.exists():
        return False
    if not autogroup.read_text().strip():
        return False  # not in an autogroup: its own nice is what the scheduler weighs
    # The kernel takes one autogroup change per 100 ms from an unprivileged user (EAGAIN otherwise),
    # and honcho starts every process at once.
    for _ in range(50):
        try:
            autogroup.write_text(str(nice))
            return True
        except BlockingIOError:
            time.sleep(0.1)
        except OSError as exc:
            # A kernel or sandbox that refuses the change: the process still runs at its own nice.
            print(f"pilot_status.priority: session priority left as it is ({autogroup}: {exc})", file=sys.stderr)
            return False
    raise OSError(f"could not set {autogroup} to {nice}: the kernel kept answering EAGAIN")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        nice = int(argv[0])
        lower(nice)
    except ValueError as exc:
        print(f"pilot_status.priority: {exc}\n{USAGE}", file=sys.stderr)
        return 2
    command = argv[1:]
    try:
        os.execvp(command[0], command)
    except OSError as exc:
        print(f"pilot_status.priority: cannot run {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    return 0  # not reached: execvp replaced this process


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
