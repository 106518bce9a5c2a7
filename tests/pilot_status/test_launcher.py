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


def launch_in_cgroups(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return launch(*args, env={"LAUNCH_SLICES": "1", "LAUNCH_CGROUP_ROOT": str(root)})


def pid_of(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


PRINT_PID = (sys.executable, "-c", "import os; print(os.getpid())")


@pytest.mark.parametrize("launch_class, shares, weight", [("otp", "10240", "1000"), ("bulk", "204", "20")])
def test_without_systemd_each_process_gets_a_group_of_its_own_in_its_weighted_slice(tmp_path, launch_class, shares,
                                                                                      weight):
    # What systemd makes for a unit in a slice: the slice weighted as deploy/systemd's, a group per process inside.
    # cgroup v1 (a cpu.shares file at the root) takes the weight as shares, in systemd's mapping (weight × 1024 / 100).
    v1, v2 = tmp_path / "v1", tmp_path / "v2"
    v1.mkdir(), v2.mkdir()
    (v1 / "cpu.shares").write_text("1024\n")
    for root, file, value in ((v1, "cpu.shares", shares), (v2, "cpu.weight", weight)):
        pid = pid_of(launch_in_cgroups(root, launch_class, *PRINT_PID))
        slice_ = root / f"pilot-status-{launch_class}.slice"
        assert (slice_ / file).read_text().strip() == value
        # The launcher's own pid, which exec hands to the command: the process itself is in the group.
        assert (slice_ / f"run-{pid}.scope" / "cgroup.procs").read_text().strip() == pid
    assert (v2 / f"pilot-status-{launch_class}.slice" / "cgroup.subtree_control").read_text().strip() == "+cpu"


def test_a_launch_removes_the_empty_groups_of_processes_that_ended_and_keeps_the_others(tmp_path):
    slice_ = tmp_path / "pilot-status-bulk.slice"
    ended, running = slice_ / "run-1.scope", slice_ / "run-2.scope"
    ended.mkdir(parents=True)
    running.mkdir()
    (running / "cgroup.procs").write_text("2\n")  # a group with a process in it cannot be removed
    pid_of(launch_in_cgroups(tmp_path, "bulk", *PRINT_PID))
    assert not ended.exists() and running.exists()


def test_a_cgroup_root_it_cannot_write_still_starts_the_command_and_says_so(tmp_path):
    (tmp_path / "file").write_text("")
    for root, launch_class in ((tmp_path / "file", "otp"), (Path("/proc/self/no-such-group"), "bulk")):
        done = launch_in_cgroups(root, launch_class, *PRINT_PID)
        assert done.returncode == 0 and done.stdout.strip().isdigit(), done.stderr
        assert "no cgroup of its class" in done.stderr


def test_launch_slices_zero_leaves_cgroups_alone(tmp_path):
    done = launch("bulk", *PRINT_PID, env={"LAUNCH_SLICES": "0", "LAUNCH_CGROUP_ROOT": str(tmp_path)})
    assert done.returncode == 0 and not list(tmp_path.iterdir())


def test_it_describes_the_cgroup_slices_it_would_make(tmp_path):
    done = launch("--describe", env={"LAUNCH_SLICES": "1", "LAUNCH_CGROUP_ROOT": str(tmp_path), "PATH": "/usr/bin:/bin",
                                     "XDG_RUNTIME_DIR": ""})
    assert done.returncode == 0, done.stderr
    if "systemd scopes" not in done.stdout:  # a host with systemd uses its scopes first
        assert f"cgroup v2 slices pilot-status-otp.slice / pilot-status-bulk.slice under {tmp_path}" in done.stdout


REAL_V1 = Path("/sys/fs/cgroup/cpu/cpu.shares")


@pytest.mark.skipif(not (REAL_V1.exists() and os.access(REAL_V1.parent, os.W_OK)) or Path("/run/systemd/system").is_dir(),
                    reason="no writable cgroup v1 cpu controller without systemd here")
def test_on_this_host_the_kernel_puts_a_bulk_process_in_the_bulk_slice():
    show = (sys.executable, "-c", "print(open('/proc/self/cgroup').read())")
    done = launch("bulk", *show, env={"LAUNCH_SLICES": "1"})
    assert done.returncode == 0, done.stderr
    assert re.search(r"^\d+:cpu(,cpuacct)?:/pilot-status-bulk\.slice/run-\d+\.scope$", done.stdout, re.M), done.stdout
    assert (REAL_V1.parent / "pilot-status-bulk.slice" / "cpu.shares").read_text().strip() == "204"


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
