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


# The idle CPU group (pilot_status.priority.join_idle_group): every background process in a group of its own inside
# one cgroup that the kernel runs only on cores nothing else wants.
V1_CGROUP = "4:memory:/x\n1:cpu,cpuacct:/\n0::/\n"
V1_MOUNTS = ("32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct\n"
             "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n")


def test_the_cpu_cgroup_of_a_hybrid_host_is_the_v1_one():
    from pilot_status.priority import cpu_cgroup

    mount = Path("/sys/fs/cgroup/cpu,cpuacct")
    assert cpu_cgroup(V1_CGROUP, V1_MOUNTS) == (mount, mount, 1)
    assert cpu_cgroup("1:cpu:/app/web\n", V1_MOUNTS) == (mount, mount / "app/web", 1)
    # cpuacct alone is not the CPU controller
    assert cpu_cgroup("2:cpuacct:/\n0::/\n", V1_MOUNTS) is None


def test_the_cpu_cgroup_on_cgroup_v2_needs_the_cpu_controller(tmp_path):
    from pilot_status.priority import cpu_cgroup

    mounts = f"41 31 0:38 / {tmp_path} rw,relatime - cgroup2 cgroup2 rw\n"
    assert cpu_cgroup("0::/user.slice/run.scope\n", mounts) is None  # no cgroup.controllers: no cpu there
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert cpu_cgroup("0::/user.slice/run.scope\n", mounts) == (tmp_path, tmp_path / "user.slice/run.scope", 2)
    # Inside a container without a cgroup namespace, the mount's root is the container's own cgroup.
    container = f"41 31 0:38 /docker/abc {tmp_path} rw,relatime - cgroup2 cgroup2 rw\n"
    assert cpu_cgroup("0::/docker/abc\n", container) == (tmp_path, tmp_path, 2)


def fake_v2_tree(tmp_path: Path, idle_file: bool) -> tuple[Path, Path]:
    """A stand-in for a cgroup v2 hierarchy (plain files: mkdir makes no interface files, so the group is made
    here first when it should have cpu.idle). Returns /proc/self/cgroup and /proc/self/mountinfo stand-ins."""
    (tmp_path / "cgroup.controllers").write_text("cpu io memory\n")
    (tmp_path / "cgroup.subtree_control").write_text("")
    (tmp_path / "app.slice/run.scope").mkdir(parents=True)
    (tmp_path / "app.slice/cgroup.subtree_control").write_text("memory\n")
    if idle_file:
        (tmp_path / "app.slice/pilot-status-background").mkdir()
        (tmp_path / "app.slice/pilot-status-background/cpu.idle").write_text("0\n")
    proc_cgroup, mountinfo = tmp_path / "proc-cgroup", tmp_path / "mountinfo"
    proc_cgroup.write_text("0::/app.slice/run.scope\n")
    mountinfo.write_text(f"41 31 0:38 / {tmp_path} rw,relatime - cgroup2 cgroup2 rw\n")
    return proc_cgroup, mountinfo


def test_the_process_joins_an_idle_group_beside_its_own(tmp_path):
    from pilot_status.priority import join_idle_group

    group = join_idle_group(*fake_v2_tree(tmp_path, idle_file=True))
    # v2 holds processes in leaves only: beside run.scope, with the parent's cpu controller switched on; inside the
    # idle group, a group of the process's own, so that the background processes share the idle time by process.
    idle = tmp_path / "app.slice/pilot-status-background"
    assert group == idle / f"p{os.getpid()}"
    assert (idle / "cpu.idle").read_text() == "1"
    assert (group / "cgroup.procs").read_text() == str(os.getpid())
    assert (tmp_path / "app.slice/cgroup.subtree_control").read_text() == "+cpu"
    assert (idle / "cgroup.subtree_control").read_text() == "+cpu"


def test_the_groups_of_ended_processes_are_removed_and_live_ones_kept(tmp_path):
    from pilot_status.priority import join_idle_group

    proc_cgroup, mountinfo = fake_v2_tree(tmp_path, idle_file=True)
    idle = tmp_path / "app.slice/pilot-status-background"
    (idle / "p1").mkdir()  # an ended process's group: nothing in it (a real cgroup lists its processes)
    (idle / "p2").mkdir()
    (idle / "p2/cgroup.procs").write_text("2\n")  # a running one's
    join_idle_group(proc_cgroup, mountinfo)
    assert not (idle / "p1").exists()
    assert (idle / "p2/cgroup.procs").read_text() == "2\n"


def test_a_process_started_by_a_background_process_stays_in_its_group(tmp_path):
    from pilot_status.priority import join_idle_group

    proc_cgroup, mountinfo = fake_v2_tree(tmp_path, idle_file=True)
    proc_cgroup.write_text("0::/app.slice/pilot-status-background/p7\n")
    assert join_idle_group(proc_cgroup, mountinfo) == tmp_path / "app.slice/pilot-status-background/p7"
    assert not (tmp_path / "app.slice/pilot-status-background/p7").exists()  # nothing made, nothing moved


def test_without_cpu_idle_the_group_gets_the_lowest_weight(tmp_path):
    # Kernels before 5.15 have no cpu.idle.
    from pilot_status.priority import join_idle_group

    group = join_idle_group(*fake_v2_tree(tmp_path, idle_file=False))
    assert group is not None and (group.parent / "cpu.weight").read_text() == "1"
    assert not (group.parent / "cpu.idle").exists()


def test_a_host_that_refuses_the_group_leaves_the_process_at_its_nice(tmp_path, capsys):
    from pilot_status.priority import join_idle_group

    proc_cgroup, mountinfo = fake_v2_tree(tmp_path, idle_file=False)
    (tmp_path / "app.slice/pilot-status-background").write_text("not a folder")
    assert join_idle_group(proc_cgroup, mountinfo) is None
    assert "no idle CPU group, nice alone" in capsys.readouterr().err
    # and a host with no CPU controller at all says nothing
    mountinfo.write_text("")
    assert join_idle_group(proc_cgroup, mountinfo) is None
    assert capsys.readouterr().err == ""


def host_idle_group() -> Path | None:
    """The real idle group's folder when this host lets the tests make it (root and a writable CPU cgroup)."""
    from pilot_status.priority import idle_group_path

    group = idle_group_path()
    if group is None or os.geteuid() != 0 or not os.access(group.parent, os.W_OK):
        return None
    return group


# Prints the cgroup of the CPU controller this process is in (v1 line first, else the v2 one).
SHOW_GROUP = ("from pathlib import Path; lines = Path('/proc/self/cgroup').read_text().splitlines();"
              "print(([l for l in lines if 'cpu' in l.split(':')[1].split(',')] or [l for l in lines if l.startswith('0::')])[0]"
              ".split(':', 2)[2])")


@pytest.mark.skipif(host_idle_group() is None, reason="this host does not let the tests make a CPU cgroup")
@pytest.mark.parametrize("nice, env, joins", [("7", {}, True), ("7", {"BACKGROUND_IDLE_GROUP": "0"}, False),
                                              ("0", {}, False)])
def test_a_background_process_runs_in_the_hosts_idle_group(nice, env, joins):
    group = host_idle_group()
    assert group is not None
    done = run_wrapped(nice, sys.executable, "-c", SHOW_GROUP, env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    assert ("/pilot-status-background/p" in done.stdout) is joins, done.stdout
    if joins:
        assert (group / "cpu.idle").read_text().strip() == "1"
        own = group / done.stdout.strip().rsplit("/", 1)[1]
        assert own.name.startswith("p") and own.is_dir()  # a group of its own inside the idle one
        own.rmdir()  # its process has ended


def test_the_idle_group_path_is_where_join_puts_it(tmp_path):
    from pilot_status.priority import idle_group_path, join_idle_group

    proc_cgroup, mountinfo = fake_v2_tree(tmp_path, idle_file=True)
    assert idle_group_path(proc_cgroup, mountinfo) == tmp_path / "app.slice/pilot-status-background"
    group = join_idle_group(proc_cgroup, mountinfo)
    assert group is not None and group.parent == idle_group_path(proc_cgroup, mountinfo)
    mountinfo.write_text("")
    assert idle_group_path(proc_cgroup, mountinfo) is None
