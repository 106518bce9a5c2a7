"""One description of the processes (pilot_status/topology.py, issue 25): the Procfile is generated from it,
docker-compose.yml runs the same commands, and the bench, chaos and test stacks take theirs from it."""

from __future__ import annotations

import re
import shlex
import subprocess
from typing import Any

from pilot_status import topology
from pilot_status.lane_worker import settings_for
from tests.pilot_status.test_compose import compose, production_values
from tests.support.processes import ROOT


def test_the_committed_procfile_is_the_generated_one():
    generated = subprocess.run(["bash", "scripts/env.sh", ".venv/bin/python", "-m", "pilot_status.topology", "procfile"],
                               cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert generated.returncode == 0, generated.stderr
    assert generated.stdout == topology.procfile()
    assert (ROOT / "Procfile").read_text() == topology.procfile(), (
        "the Procfile is not what pilot_status/topology.py describes: "
        "scripts/env.sh .venv/bin/python -m pilot_status.topology procfile > Procfile")


def test_the_procfile_launches_each_process_in_its_class_and_keeps_web_first():
    lines = [line for line in topology.procfile().splitlines() if line and not line.startswith("#")]
    assert [line.split(":", 1)[0] for line in lines] == [p.name for p in topology.PROCESSES]
    assert lines[0].startswith("web: exec scripts/launch.sh otp gunicorn pilot_status.wsgi:application -b 127.0.0.1:$PORT "
                               "-w ${WEB_CONCURRENCY:-2} ")
    for line, process in zip(lines, topology.PROCESSES):
        assert line.split(": ", 1)[1].startswith("exec scripts/launch.sh bulk ") is process.background, process.name
    # The OTP path (and Evolution's stand-in) at normal priority, everything else of ours in the background.
    assert {p.name for p in topology.PROCESSES if not p.background} == {"web", "worker_otp", "relay_otp", "simulator"}


def test_the_description_says_what_each_process_is():
    assert [p.name for p in topology.PROCESSES if p.scaling == "single"] == ["beat", "simulator"]
    assert {p.lane for p in topology.PROCESSES if p.lane} == {"otp", "utility", "marketing"}
    for process in topology.PROCESSES:
        assert process.job and process.concurrency, process.name
        assert (process.ready is None) is (process.listens is not None) or process.name == "beat", process.name
    queues = [queue for p in topology.PROCESSES if p.name.startswith("worker_") for queue in p.queues]
    assert sorted(queues) == sorted(("otp", "utility", "marketing", "maintenance", "sync", "bulk", "callbacks", "callbacks_relay"))  # each once
    relayed = [lane for p in topology.PROCESSES if p.name.startswith("relay") for lane in p.queues]
    assert sorted(relayed) == ["marketing", "otp", "utility"]


def test_the_callbacks_relay_pass_has_a_worker_of_its_own():
    # Deliveries wait on customers' servers; the pass that writes and hands them out must never wait for a
    # thread behind them (issue 45 §2).
    serving = {queue: p.name for p in topology.PROCESSES for queue in p.queues}
    assert serving["callbacks_relay"] == "worker_callbacks_relay" and serving["callbacks"] == "worker_callbacks"
    assert topology.process("worker_callbacks").queues == ("callbacks",)
    assert topology.process("worker_callbacks_relay").queues == ("callbacks_relay",)


def compose_command(service: dict[str, Any]) -> list[str]:
    """The argv the container runs: a `sh -c 'exec …'` one read as the shell splits it."""
    command = [str(part) for part in service["command"]]
    if command[:2] == ["sh", "-c"]:
        command = shlex.split(command[2])
        assert command[0] == "exec"
        return command[1:]
    return command


def test_compose_runs_the_described_commands():
    services = {name.replace("_", "-"): service for name, service in compose(production_values())["services"].items()}
    long_running = {name for name, service in services.items()
                    if "build" in service and service.get("restart") != "no"}
    assert long_running == {p.service for p in topology.PROCESSES}
    for process in topology.PROCESSES:
        service = services[process.service]
        assert compose_command(service) == process.command(topology.COMPOSE), process.service
        # Priorities: compose weighs the background processes' CPU as the Procfile lowers their nice.
        assert bool(service.get("cpu_shares")) is process.background, process.service
        assert ("demo" in service.get("profiles", [])) is process.stand_in, process.service
        if process.scaling == "single":
            assert (service.get("deploy") or {}).get("replicas", 1) == 1 and "scale" not in service, process.service


def test_the_test_stack_runs_the_described_commands():
    from tests.support.processes import Stack

    stack = Stack.__new__(Stack)
    stack.env, stack.port, stack.web_workers = {}, 8123, 3
    site = stack.site()
    assert stack._web().argv == topology.process("web").command(site)
    assert "-w" in stack._web().argv and stack._web().argv[stack._web().argv.index("-w") + 1] == "3"
    assert stack._relay().argv == topology.RELAY_ALL_LANES.command(site)  # one relay for every lane
    assert stack._consumer().argv == topology.process("consumer").command(site)
    assert stack._worker("otp").argv == topology.lane_worker_command(settings_for("otp", {}), site)
    assert stack._worker("otp").argv[-1] == "info" and "otp@test" in stack._worker("otp").argv
    for queue in ("maintenance", "sync", "bulk"):
        assert stack._maintenance_worker(queue, {}).argv == topology.process(f"worker_{queue}").command(site)
    assert stack._beat({}).argv == topology.process("beat").command(site)


def test_the_bench_runs_the_described_commands(monkeypatch):
    from bench.launcher import BenchStack, StackConfig

    for name in ("BENCH_NICE", "BENCH_WEBHOOK_WORKERS", "BENCH_WEBHOOK_ARGS", "BACKGROUND_NICE",
                 "BENCH_WORKER_ARGS_UTILITY", "LANE_WORKER_POOL", "LANE_WORKER_CONCURRENCY_UTILITY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("EVOLUTION_API_KEY", "key")
    stack = BenchStack(StackConfig("postgres://bench/x", web_workers=3))
    site = stack.site()
    launcher = str(ROOT / topology.LAUNCHER)
    for name in ("web", "webhook", "relay", "relay-otp", "consumer"):
        process = {"web": stack.web, "webhook": stack.webhook, "relay": stack.relay, "relay-otp": stack.relay_otp,
                   "consumer": stack.consumer}[name]()
        described = topology.process(name)
        assert process.argv == topology.launched(described, described.command(site), launcher), name
    assert stack.web().argv[stack.web().argv.index("-w") + 1] == "3"
    utility = stack.worker("utility")
    assert utility.argv == [launcher, "bulk", *topology.lane_worker_command(settings_for("utility", {}), site)]
    assert "bench.celery_app" in utility.argv and "utility@bench" in utility.argv
    assert stack.worker("otp").argv == [launcher, "otp", *topology.lane_worker_command(settings_for("otp", {}), site)]


def test_chaos_runs_the_described_webhook_pool():
    from chaos.stack import webhook_pool_argv

    site = topology.stack_site(8000, webhook_port=8124, webhook_pool=("-w", "2", "--worker-class", "gthread", "--threads", "4"),
                               access_log=())
    assert webhook_pool_argv(8124, workers=2, threads=4) == topology.process("webhook").command(site)


def test_the_generator_refuses_anything_but_procfile_or_systemd_with_its_usage(capsys, tmp_path):
    assert topology.main([]) == 2 and topology.main(["compose"]) == 2 and topology.main(["systemd"]) == 2
    assert "usage: python -m pilot_status.topology procfile | systemd FOLDER" in capsys.readouterr().err
    assert topology.main(["procfile"]) == 0
    assert capsys.readouterr().out == topology.procfile()
    assert topology.main(["systemd", str(tmp_path / "units")]) == 0
    assert {path.name: path.read_text() for path in (tmp_path / "units").iterdir()} == topology.systemd_units()


def test_the_committed_systemd_units_are_the_generated_ones():
    committed = {path.name: path.read_text() for path in (ROOT / "deploy" / "systemd").glob("pilot-status*")}
    assert committed == topology.systemd_units(), (
        "deploy/systemd is not what pilot_status/topology.py describes: "
        "scripts/env.sh .venv/bin/python -m pilot_status.topology systemd deploy/systemd")


def test_the_systemd_units_run_every_process_of_ours_once_in_its_slice():
    units = topology.systemd_units()
    ours = [p for p in topology.PROCESSES if not p.stand_in]
    assert sorted(name for name in units if name.endswith(".service")) == sorted(
        f"pilot-status-{p.service}.service" for p in ours)
    for process in ours:
        unit = units[f"pilot-status-{process.service}.service"]
        assert f"Slice=pilot-status-{'bulk' if process.background else 'otp'}.slice\n" in unit, process.name
        assert f"ExecStart={' '.join(process.command(topology.SYSTEMD))}\n" in unit, process.name
        assert "PartOf=pilot-status.target" in unit and f"pilot-status-{process.service}.service" in units["pilot-status.target"]
    # Celery's %h survives systemd's specifiers; nothing else of systemd's is left unescaped.
    assert "-n sync@%%h " in units["pilot-status-worker-sync.service"]
    assert all(not re.search(r"(?<!%)%[a-zA-Z](?<!%%h)", text.replace("%%", "")) for text in units.values())
