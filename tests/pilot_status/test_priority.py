"""Background processes run at a lower CPU priority, their session's included (pilot_status.priority)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pilot_status.priority import DEFAULT_BACKGROUND_NICE

ROOT = Path(__file__).resolve().parents[2]
HAS_AUTOGROUPS = Path("/proc/self/autogroup").exists()
# Prints the process's own nice and its session's (autogroup) nice.
# '-' when there is no autogroup: no such file, or an empty one (a session outside any autogroup).
SHOW = ("import os, re; from pathlib import Path; p = Path('/proc/self/autogroup');"
        "m = re.search(r'nice (-?\\d+)', p.read_text()) if p.exists() else None;"
        "print(os.getpriority(os.PRIO_PROCESS, 0), m.group(1) if m else '-')")
# The processes that an OTP passes through, and the simulator (Evolution's stand-in, not ours to lower).
FOREGROUND = {"web", "worker_otp", "relay_otp", "simulator"}


def run_wrapped(*args: str, **popen: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pilot_status.priority", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=30, **popen)  # type: ignore[call-overload]


def autogroup_nice(line: str) -> str:
    match = re.search(r"nice (-?\d+)", line)
    assert match, line
    return match.group(1)


def test_a_session_leader_lowers_itself_and_its_session():
    done = run_wrapped("7", sys.executable, "-c", SHOW, start_new_session=True)
    assert done.returncode == 0, done.stderr
    nice, session = done.stdout.split()
    assert nice == "7"
    assert session == ("7" if HAS_AUTOGROUPS else "-")


@pytest.mark.skipif(not HAS_AUTOGROUPS, reason="this kernel has no autogroups")
def test_a_process_inside_someone_elses_session_leaves_the_session_alone():
    # A shell leads a new session (the test runner's own may be outside any autogroup) and runs the
    # wrapped process inside it; the session's priority is read before and after.
    wrapped = shlex.join([sys.executable, "-m", "pilot_status.priority", "7", sys.executable, "-c", SHOW])
    script = f"cat /proc/self/autogroup; {wrapped}; cat /proc/self/autogroup"
    done = subprocess.run(["sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30,
                          start_new_session=True)
    assert done.returncode == 0, done.stderr
    before, inside, after = done.stdout.splitlines()
    nice, session = inside.split()
    assert nice == "7"
    assert autogroup_nice(before) == session == autogroup_nice(after) == "0"


def test_it_never_raises_a_priority():
    done = run_wrapped("3", sys.executable, "-c", SHOW, preexec_fn=lambda: os.nice(12))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "12"


def test_zero_changes_nothing():
    # BACKGROUND_NICE=0 (issue 25's switch): neither the process's nice nor its new session's.
    done = run_wrapped("0", sys.executable, "-c", SHOW, start_new_session=True)
    assert done.returncode == 0, done.stderr
    nice, session = done.stdout.split()
    assert nice == str(os.getpriority(os.PRIO_PROCESS, 0))
    assert session == ("0" if HAS_AUTOGROUPS else "-")  # a new session's autogroup, as the kernel made it


def test_zero_never_touches_the_sessions_autogroup():
    # Even where an autogroup is there to write, 0 neither reads nor writes it.
    done = run_with_fake_autogroup("/autogroup-1 nice 0\n", 0, "None", nice=0)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "None", "0", "untouched"]


def test_zero_starts_the_benchs_processes_without_the_wrapper():
    from bench.launcher import priorities

    assert set(priorities({"BACKGROUND_NICE": "0"}).values()) == {0}  # launcher: `if nice:` wraps
    assert set(priorities({}).values()) == {DEFAULT_BACKGROUND_NICE}


# A stand-in for /proc/self/autogroup, run in a session leader of its own: `lower` only touches the
# session's priority from there. It prints what `lower` returned, what was written and the refusals left.
FAKE_AUTOGROUP = """
from pilot_status.priority import lower

class Autogroup:
    value = None
    looked = False
    def __init__(self, shown, refusals, refusal):
        self.shown, self.refusals, self.refusal = shown, refusals, refusal
    def exists(self):
        self.looked = True
        return True
    def read_text(self):
        self.looked = True
        return self.shown
    def write_text(self, text):
        if self.refusals:
            self.refusals -= 1
            raise self.refusal
        self.value = text

group = Autogroup({shown!r}, {refusals}, {refusal})
print(lower({nice}, group), group.value, group.refusals, "looked" if group.looked else "untouched")
"""


def run_with_fake_autogroup(shown: str, refusals: int, refusal: str, nice: int = 5) -> subprocess.CompletedProcess[str]:
    snippet = FAKE_AUTOGROUP.format(shown=shown, refusals=refusals, refusal=refusal, nice=nice)
    return subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, capture_output=True, text=True, timeout=30,
                          start_new_session=True)


def test_the_kernels_rate_limit_on_session_changes_is_waited_out():
    # An unprivileged user gets one autogroup change per 100 ms (EAGAIN), and honcho starts every process at once.
    done = run_with_fake_autogroup("/autogroup-1 nice 0\n", 2, 'BlockingIOError(11, "Resource temporarily unavailable")')
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "5", "0", "looked"]


def test_a_session_outside_any_autogroup_is_left_to_its_own_nice():
    # The kernel shows an empty file for a task in no autogroup (CI's runner was one); writing would mean nothing.
    done = run_with_fake_autogroup("", 0, "None")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "None", "0", "looked"]


def test_a_refused_session_change_still_runs_the_process_at_its_own_nice():
    done = run_with_fake_autogroup("/autogroup-1 nice 0\n", 1, 'PermissionError(1, "Operation not permitted")')
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "None", "0", "looked"]
    assert "session priority left as it is" in done.stderr and "Operation not permitted" in done.stderr


@pytest.mark.parametrize(
    "args, code, message",
    [
        ([], 2, "usage: python -m pilot_status.priority NICE COMMAND"),
        (["5"], 2, "usage:"),
        (["high", "true"], 2, "invalid literal"),
        (["20", "true"], 2, "NICE must be 0..19, got 20"),
        (["-1", "true"], 2, "NICE must be 0..19, got -1"),
        (["5", "no-such-command-here"], 127, "cannot run 'no-such-command-here'"),
    ],
)
def test_bad_arguments_are_refused_with_a_message(args, code, message):
    done = run_wrapped(*args)
    assert done.returncode == code
    assert message in done.stderr


def procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))


def test_the_procfile_runs_everything_but_the_otp_path_in_the_background():
    wrapper = f"exec python -m pilot_status.priority ${{BACKGROUND_NICE:-{DEFAULT_BACKGROUND_NICE}}} "
    processes = procfile()
    assert FOREGROUND <= set(processes)
    for name, command in processes.items():
        if name in FOREGROUND:
            assert "pilot_status.priority" not in command, name
        else:
            assert command.startswith(wrapper), name


def test_compose_and_the_bench_give_the_same_processes_the_background_weight():
    from bench.launcher import background_processes

    background = {name.replace("_", "-") for name in procfile() if name not in FOREGROUND}
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    # Below the default weight (1024): the servers weigh more (test_compose), every process of ours but the OTP path less.
    lowered = {name.replace("_", "-") for name, service in services.items() if service.get("cpu_shares", 1024) < 1024}
    assert lowered == background
    assert background_processes() == background
