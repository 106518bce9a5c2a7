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

Where the host lets it (root, or a delegated CPU cgroup), the process also moves into a CPU cgroup of its own
inside one group that all background work shares and that the kernel runs as idle (`cpu.idle`, Linux 5.15+; the
lowest weight where that file is missing): the background runs whenever a core is free, and anything else that
wakes takes the core from it at once. Nice 10 cannot do that: each background session still weighs a tenth of a
foreground one, and ten of them together weigh as much as the OTP relay. Inside the idle group each process keeps
a group of its own (its children share it, as they shared its session), so the background processes still share
the idle time as their sessions did: in one flat group every thread weighs the same, and the webhook pool's
sixteen threads took the time from the lane worker, whose threads then queued for its pooled connections (bench
B8 at 1 s: 15-17 against 52-70 sends/s flat; 43 against 55 nested, with its CPU ceiling 44 against 53).
Paired B3 behind the backlog, nested: OTP p99 31 ms against 52, idle 25 and 32 (bench/findings.md).
`BACKGROUND_IDLE_GROUP=0` leaves the group out.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

AUTOGROUP = Path("/proc/self/autogroup")
# The Procfile's `${BACKGROUND_NICE:-10}`: nice 10 weighs a tenth of nice 0 in the scheduler.
DEFAULT_BACKGROUND_NICE = 10
# The cgroup every background process joins, beside the one the process starts in.
IDLE_GROUP = "pilot-status-background"
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


def cpu_cgroup(proc_cgroup: str, mountinfo: str) -> tuple[Path, Path, int] | None:
    """Where this process's CPU cgroup is: (the hierarchy's mount point, the cgroup's folder, the cgroup
    version, 1 or 2), or None when the CPU controller is mounted nowhere this process can see.
    Arguments: the text of /proc/self/cgroup and of /proc/self/mountinfo."""
    paths: dict[int, str] = {}
    for line in proc_cgroup.splitlines():
        number, controllers, path = line.split(":", 2)
        if number == "0" and not controllers:
            paths[2] = path
        elif "cpu" in controllers.split(","):
            paths[1] = path
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        mount_root, mount_point = fields.split()[3:5]
        fstype, _source, options = (rest.split() + ["", ""])[:3]
        if fstype == "cgroup" and "cpu" in options.split(",") and 1 in paths:
            version = 1
        elif fstype == "cgroup2" and 2 in paths and "cpu" in _read(Path(mount_point, "cgroup.controllers")).split():
            version = 2
        else:
            continue
        path = paths[version]
        if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
            path = path[len(mount_root):]  # a container sees its own cgroup as the mount's root
        return Path(mount_point), Path(mount_point, path.lstrip("/")), version
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _beside(found: tuple[Path, Path, int]) -> Path:
    """The cgroup the idle group goes into: this process's own (v1), or its parent, since cgroup v2 lets only a
    leaf hold processes."""
    mount_point, current, version = found
    return current if version == 1 or current == mount_point else current.parent


def idle_group_path(proc_cgroup: Path = Path("/proc/self/cgroup"),
                    mountinfo: Path = Path("/proc/self/mountinfo")) -> Path | None:
    """Where the background processes started from this process have their idle group (made or not yet), or None
    when the CPU controller is mounted nowhere this process can see."""
    found = cpu_cgroup(_read(proc_cgroup), _read(mountinfo))
    return None if found is None else _beside(found) / IDLE_GROUP


def join_idle_group(proc_cgroup: Path = Path("/proc/self/cgroup"),
                    mountinfo: Path = Path("/proc/self/mountinfo")) -> Path | None:
    """Move this process into a group of its own inside the background's idle CPU cgroup, made beside the process's
    own cgroup; returns the process's group, or None (with a line on stderr) when the host does not allow it: the
    process then runs at its nice alone."""
    found = cpu_cgroup(_read(proc_cgroup), _read(mountinfo))
    if found is None:
        return None
    mount_point, current, version = found
    if current.parent.name == IDLE_GROUP:
        return current  # started by a background process: it shares its parent's group, as it shared its session
    parent = _beside(found)
    idle = parent / IDLE_GROUP
    group = idle / f"p{os.getpid()}"
    try:
        if version == 2:
            _enable_cpu_below(parent)
        idle.mkdir(exist_ok=True)
        if (idle / "cpu.idle").exists():
            (idle / "cpu.idle").write_text("1")
        elif version == 1:
            (idle / "cpu.shares").write_text("2")  # the lowest weight cgroup v1 takes
        else:
            (idle / "cpu.weight").write_text("1")
        if version == 2:
            _enable_cpu_below(idle)
        _remove_empty_groups(idle)
        for attempt in range(3):
            group.mkdir(exist_ok=True)
            try:
                (group / "cgroup.procs").write_text(str(os.getpid()))
                break
            except FileNotFoundError:
                # Another background process starting at the same time took the new group for an ended one's.
                if attempt == 2:
                    raise
    except OSError as exc:
        print(f"pilot_status.priority: no idle CPU group, nice alone ({group}: {exc})", file=sys.stderr)
        return None
    return group


def _enable_cpu_below(group: Path) -> None:
    """cgroup v2: give the groups below this one the CPU controller, which their weights and cpu.idle need."""
    if "cpu" not in _read(group / "cgroup.subtree_control").split():
        (group / "cgroup.subtree_control").write_text("+cpu")


def member_groups(idle: Path) -> dict[Path, bool]:
    """Each background process's group inside the idle group, and whether a process still runs in it."""
    return {child: bool(_read(child / "cgroup.procs").strip()) for child in idle.glob("p[0-9]*") if child.is_dir()}


def _remove_empty_groups(idle: Path) -> None:
    """Remove the groups of background processes that have ended (the kernel refuses to remove one that still
    holds a process), so that restarts do not pile them up."""
    for child, running in member_groups(idle).items():
        if not running:
            try:
                child.rmdir()
            except OSError:
                pass  # not empty after all, or not ours to remove


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        nice = int(argv[0])
        lower(nice)
        if nice and os.environ.get("BACKGROUND_IDLE_GROUP", "1") != "0":
            join_idle_group()
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
