"""`make run`'s launcher (scripts/launch.sh) sets the processes' CPU priority; the product never does.

The client API and the OTP path start as they are (class `otp`); every other process of ours runs at
BACKGROUND_NICE, its session's included where the kernel groups by session (class `bulk`). The systemd units in
deploy/systemd and compose's cpu_shares give the same processes the same places.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pilot_status import topology

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = str(ROOT / "scripts" / "launch.sh")
# Whether a new session gets an autogroup of its own. Asked of a new session, not of this process: a process that
# never left init's session (a CI runner's, say) shows an empty /proc/self/autogroup on a kernel that has them.
HAS_AUTOGROUPS = Path("/proc/self/autogroup").exists() and bool(subprocess.run(
    ["cat", "/proc/self/autogroup"], capture_output=True, text=True, start_new_session=True).stdout.strip())
# Prints the process's own nice and its session's (autogroup) nice ('-' without an autogroup).
SHOW = ("import os, re; from pathlib import Path; p = Path('/proc/self/autogroup');"
        "m = re.search(r'nice (-?\\d+)', p.read_text()) if p.exists() else None;"
        "print(os.getpriority(os.PRIO_PROCESS, 0), m.group(1) if m else '-')")
# The processes that an OTP passes through, and the simulator (Evolution's stand-in, not ours to lower).
FOREGROUND = {"web", "worker_otp", "relay_otp", "simulator"}


def launch(*args: str, env: dict[str, str] | None = None, **popen: object) -> subprocess.CompletedProcess[str]:
    environment = {**os.environ, "LAUNCH_SLICES": "0", **(env or {})}
    return subprocess.run([LAUNCH, *args], cwd=ROOT, capture_output=True, text=True, timeout=30, env=environment,
                          **popen)  # type: ignore[call-overload]


def test_a_bulk_session_leader_runs_at_background_nice_with_its_session():
    done = launch("bulk", sys.executable, "-c", SHOW, env={"BACKGROUND_NICE": "7"}, start_new_session=True)
    assert done.returncode == 0, done.stderr
    nice, session = done.stdout.split()
    assert nice == "7"
    assert session == ("7" if HAS_AUTOGROUPS else "-")


def test_the_default_background_nice_is_the_topologys():
    env = {name: value for name, value in os.environ.items() if name != "BACKGROUND_NICE"}
    done = subprocess.run([LAUNCH, "bulk", sys.executable, "-c", SHOW], cwd=ROOT, capture_output=True, text=True,
                          timeout=30, env={**env, "LAUNCH_SLICES": "0"})
    assert done.stdout.split()[0] == str(topology.DEFAULT_BACKGROUND_NICE)


@pytest.mark.skipif(not HAS_AUTOGROUPS, reason="this kernel has no autogroups")
def test_a_process_inside_someone_elses_session_leaves_the_session_alone():
    launched = shlex.join([LAUNCH, "bulk", sys.executable, "-c", SHOW])
    script = f"cat /proc/self/autogroup; BACKGROUND_NICE=7 LAUNCH_SLICES=0 {launched}; cat /proc/self/autogroup"
    done = subprocess.run(["sh", "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=30,
                          start_new_session=True)
    assert done.returncode == 0, done.stderr
    before, inside, after = done.stdout.splitlines()
    assert inside.split()[0] == "7"
    assert re.findall(r"nice (-?\d+)", before) == re.findall(r"nice (-?\d+)", after) == ["0"]


def test_otp_and_a_zero_nice_start_the_command_as_it_is():
    for args, env in ((("otp",), {"BACKGROUND_NICE": "7"}), (("bulk",), {"BACKGROUND_NICE": "0"})):
        done = launch(*args, sys.executable, "-c", SHOW, env=env, start_new_session=True)
        assert done.returncode == 0, done.stderr
        nice, session = done.stdout.split()
        assert nice == str(os.getpriority(os.PRIO_PROCESS, 0)), args
        assert session == ("0" if HAS_AUTOGROUPS else "-"), args


def test_the_launcher_execs_the_command_in_its_own_process():
    # exec, not a child: honcho, the bench and systemd stop the process they started.
    for launch_class in ("otp", "bulk"):
        proc = subprocess.Popen([LAUNCH, launch_class, sys.executable, "-c", "import os; print(os.getpid())"], cwd=ROOT,
                                stdout=subprocess.PIPE, text=True, env={**os.environ, "LAUNCH_SLICES": "0"})
        out, _ = proc.communicate(timeout=30)
        assert out.split() == [str(proc.pid)], launch_class


@pytest.mark.parametrize("args, env, message", [
    ((), {}, "usage: scripts/launch.sh otp|bulk"),
    (("idle", "true"), {}, "usage: scripts/launch.sh otp|bulk"),
    (("bulk",), {}, "usage: scripts/launch.sh otp|bulk"),
    (("bulk", "true"), {"BACKGROUND_NICE": "ten"}, "BACKGROUND_NICE must be a number"),
])
def test_bad_arguments_are_refused_with_a_message(args, env, message):
    done = launch(*args, env=env)
    assert done.returncode == 2
    assert message in done.stderr


def test_it_says_what_this_host_allows():
    done = launch("--describe", env={"BACKGROUND_NICE": "10"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("bulk at nice 10") and "slices" in done.stdout


def procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))


def test_the_procfile_starts_every_process_of_ours_through_the_launcher_in_its_class():
    for name, command in procfile().items():
        if name == "simulator":
            assert "launch.sh" not in command
        elif name in FOREGROUND:
            assert command.startswith("exec scripts/launch.sh otp "), name
        else:
            assert command.startswith("exec scripts/launch.sh bulk "), name


def test_compose_systemd_and_the_bench_give_the_same_processes_the_background_weight():
    from bench.launcher import background_processes

    background = {name.replace("_", "-") for name in procfile() if name not in FOREGROUND}
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    # Below the default weight (1024): the servers weigh more (test_compose), every process of ours but the OTP path less.
    lowered = {name.replace("_", "-") for name, service in services.items() if service.get("cpu_shares", 1024) < 1024}
    assert lowered == background
    assert background_processes() == background
    units = topology.systemd_units()
    in_bulk = {name.removeprefix("pilot-status-").removesuffix(".service") for name, text in units.items()
               if "Slice=pilot-status-bulk.slice" in text}
    assert in_bulk == background


def test_the_launcher_weighs_the_slices_as_deploy_systemd_does():
    script = (ROOT / "scripts" / "launch.sh").read_text()
    for name, (_, weight) in topology.SLICES.items():
        assert f"{name.upper()}_WEIGHT={weight}\n" in script, name
        assert f"CPUWeight={weight}\n" in topology.systemd_units()[f"pilot-status-{name}.slice"]
    assert topology.SLICES["otp"][1] > 100 > topology.SLICES["bulk"][1]  # systemd's default weight is 100


def test_the_bench_starts_its_processes_through_the_launcher_as_make_run_does(monkeypatch):
    from bench.launcher import BenchStack, StackConfig, priorities

    for name in ("BENCH_NICE", "BACKGROUND_NICE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EVOLUTION_API_KEY", "key")
    stack = BenchStack(StackConfig("postgres://bench/x"))
    assert stack.relay().argv[:2] == [LAUNCH, "bulk"] and stack.relay().env["BACKGROUND_NICE"] == "10"
    assert stack.relay_otp().argv[:2] == [LAUNCH, "otp"]
    assert stack.worker("marketing").argv[:2] == [LAUNCH, "bulk"]
    assert stack.worker("marketing").env["BACKGROUND_NICE"] == "10"
    assert stack.simulator().argv[0] != LAUNCH
    monkeypatch.setenv("BACKGROUND_NICE", "0")
    assert set(priorities({"BACKGROUND_NICE": "0"}).values()) == {0}
    assert stack.relay().env["BACKGROUND_NICE"] == "0"
