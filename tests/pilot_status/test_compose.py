"""docker-compose.yml and .env.example in production mode (issue 21), read as compose reads them (no
docker here): the secrets are required, no demo runs unless the `demo` profile is asked for, and
Evolution's RabbitMQ credentials cannot reach Celery's tasks."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from pilot_status import production
from tests.support.processes import ROOT

REQUIRED = ("SECRET_KEY", "INTERNAL_WEBHOOK_SECRET", "METRICS_TOKEN", "POSTGRES_PASSWORD", "RABBITMQ_CELERY_PASSWORD",
            "RABBITMQ_EVOLUTION_PASSWORD", "RABBITMQ_CONSUMER_PASSWORD", "ALLOWED_HOSTS")
VARIABLE = re.compile(r"\$\$|\$\{([A-Z0-9_]+)(?:(:\?|:-)([^}]*))?\}")


class Missing(Exception):
    pass


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's interpolation for the forms the file uses: ${VAR}, ${VAR:-default}, ${VAR:?message}, $$."""
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, form, rest = match.groups()
        value = env.get(name, "")
        if form == ":?" and not value:
            raise Missing(f"{name}: {rest}")
        return value or (rest if form == ":-" else "")
    return VARIABLE.sub(one, text)


def interpolated(node: Any, env: dict[str, str]) -> Any:
    # Compose parses the YAML first and interpolates its values (never its comments).
    if isinstance(node, dict):
        return {key: interpolated(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolated(value, env) for value in node]
    return interpolate(node, env) if isinstance(node, str) else node


def strings(node: Any) -> list[str]:
    if isinstance(node, dict):
        return [text for value in node.values() for text in strings(value)]
    if isinstance(node, list):
        return [text for value in node for text in strings(value)]
    return [node] if isinstance(node, str) else []


def compose(env: dict[str, str] | None = None) -> dict[str, Any]:
    parsed = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return parsed if env is None else interpolated(parsed, env)


def production_values() -> dict[str, str]:
    values = {name: f"{name.lower()}-{n}-0123456789abcdef0123456789abcdef" for n, name in enumerate(REQUIRED)}
    values.update(ALLOWED_HOSTS="pilot.example.com", EVOLUTION_API_URL="https://evo.example",
                  EVOLUTION_API_KEY="evo-global-key")
    return values


@pytest.mark.parametrize("name", [*REQUIRED, "EVOLUTION_API_URL", "EVOLUTION_API_KEY"])
def test_compose_refuses_to_start_without_each_required_value(name):
    values = production_values()
    compose(values)  # everything set: it resolves
    for missing in ({k: v for k, v in values.items() if k != name}, {**values, name: ""}):
        with pytest.raises(Missing, match=name):
            compose(missing)


def test_no_secret_has_a_default_in_compose():
    text = "\n".join(strings(compose()))  # the values, without the comments
    defaulted = {name for name, form, _ in VARIABLE.findall(text) if form == ":-"}
    assert not {name for name in defaulted if "SECRET" in name or "PASSWORD" in name or "KEY" in name}
    assert not any(value in text for value in production.PUBLISHED_SECRETS if len(value) > 12)


def test_every_service_gets_the_production_secrets_from_the_environment():
    values = production_values()
    services = compose(values)["services"]
    for name, service in services.items():
        if "build" not in service:
            continue  # the infrastructure images
        env = service["environment"]
        assert env["SECRET_KEY"] == values["SECRET_KEY"] and env["INTERNAL_WEBHOOK_SECRET"] == values["INTERNAL_WEBHOOK_SECRET"]
        assert env["METRICS_TOKEN"] == values["METRICS_TOKEN"], name
        assert env["ALLOWED_HOSTS"] == "pilot.example.com" and env["DEBUG"] == "0", name
        assert urlparse(env["DATABASE_URL"]).password == values["POSTGRES_PASSWORD"]
    assert services["postgres"]["environment"]["POSTGRES_PASSWORD"] == values["POSTGRES_PASSWORD"]


def test_every_application_service_names_its_database_sessions_after_itself():
    services = compose(production_values())["services"]
    named = {name: service["environment"].get("DATABASE_APPLICATION_NAME") for name, service in services.items()
             if service.get("image") == "pilot-status:local"}
    assert named and all(value == name for name, value in named.items()), named


def test_no_demo_runs_unless_the_demo_profile_is_asked_for():
    services = compose(production_values())["services"]
    demo = {name for name, service in services.items() if "demo" in service.get("profiles", [])}
    assert demo == {"seed-demo", "simulator"}
    for name, service in services.items():
        command = " ".join(map(str, service.get("command") or []))
        if name not in demo:
            assert "seed_demo" not in command and "simulator" not in command, name
            assert not set(service.get("depends_on") or {}) & demo, name
            assert not service.get("profiles"), name
    assert "--i-know-this-is-a-demo" in services["seed-demo"]["command"]


def rabbitmq_definitions(values: dict[str, str]) -> dict[str, Any]:
    return json.loads(compose(values)["configs"]["rabbitmq-definitions"]["content"])


def test_celery_and_evolution_have_their_own_rabbitmq_user_and_vhost():
    values = production_values()
    services = compose(values)["services"]
    celery = urlparse(services["web"]["environment"]["CELERY_BROKER_URL"])
    consumer = urlparse(services["consumer"]["environment"]["EVOLUTION_RABBITMQ_URL"])
    evolution = urlparse(services["simulator"]["environment"]["EVOLUTION_RABBITMQ_URL"])  # as Evolution connects
    assert celery.path != evolution.path and consumer.path == evolution.path
    assert len({celery.username, consumer.username, evolution.username}) == 3
    assert (celery.password, consumer.password, evolution.password) == (
        values["RABBITMQ_CELERY_PASSWORD"], values["RABBITMQ_CONSUMER_PASSWORD"], values["RABBITMQ_EVOLUTION_PASSWORD"])
    assert "RABBITMQ_DEFAULT_PASS" not in (services["rabbitmq"].get("environment") or {})
    conf = compose(values)["configs"]["rabbitmq-conf"]["content"]
    assert "load_definitions = /etc/rabbitmq/pilot-status-definitions.json" in conf
    assert "loopback_users.guest = true" in conf  # the image's own default lets guest in from anywhere
    mounted = {config["source"]: config["target"] for config in services["rabbitmq"]["configs"]}
    assert mounted["rabbitmq-definitions"] == "/etc/rabbitmq/pilot-status-definitions.json"
    assert mounted["rabbitmq-conf"].startswith("/etc/rabbitmq/conf.d/")

    definitions = rabbitmq_definitions(values)
    users = {user["name"]: user["password"] for user in definitions["users"]}
    assert users == {celery.username: celery.password, consumer.username: consumer.password,
                     evolution.username: evolution.password}
    celery_vhost, evolution_vhost = celery.path.lstrip("/"), evolution.path.lstrip("/")
    assert {vhost["name"] for vhost in definitions["vhosts"]} == {celery_vhost, evolution_vhost}
    # Only Celery's user may use Celery's vhost; Evolution's user only its own.
    granted = {(grant["user"], grant["vhost"]): grant for grant in definitions["permissions"]}
    assert {user for user, vhost in granted if vhost == celery_vhost} == {celery.username}
    assert {vhost for user, vhost in granted if user == evolution.username} == {evolution_vhost}


@pytest.mark.parametrize("resource, evolution_may", [
    ("evolution_exchange", True),                 # Evolution's exchange, which it declares and publishes to
    ("evolution_exchange.messages.update", True),  # its own queues
    ("my-instance", True),                        # per-instance exchanges
    ("pilot_status.evolution.ingest", False),     # our queue: no declare, delete, bind, read or purge
    ("pilot_status.evolution.retry.5s", False),
    ("pilot_status.evolution.parked", False),
])
def test_evolutions_user_cannot_touch_our_queues(resource, evolution_may):
    definitions = rabbitmq_definitions(production_values())
    grant = next(g for g in definitions["permissions"] if g["user"] == "evolution")
    for kind in ("configure", "write", "read"):
        # RabbitMQ matches these with Erlang's re (PCRE), which reads this lookahead as Python does.
        assert bool(re.match(grant[kind], resource)) is evolution_may, kind
    consumer = next(g for g in definitions["permissions"] if g["user"] == "pilot_consumer")
    assert all(re.match(consumer[kind], resource) for kind in ("configure", "write", "read"))


def env_example() -> dict[str, str]:
    values = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        match = re.match(r"^([A-Z_][A-Z0-9_]*)=(.*)$", line.strip())
        if match:
            values[match.group(1)] = match.group(2)
    return values


def test_env_example_holds_no_usable_secret_and_compose_refuses_it():
    values = env_example()
    for name in production.SECRETS:
        assert production.secret_problem(name, values.get(name)) is not None, name
    for name in REQUIRED:
        assert not values.get(name), name
    with pytest.raises(Missing):
        compose(values)


def test_env_example_keeps_celery_and_evolution_apart():
    commented = {}
    for line in (ROOT / ".env.example").read_text().splitlines():
        match = re.match(r"^#?\s*(CELERY_BROKER_URL|EVOLUTION_RABBITMQ_URL)=(\S+)", line)
        if match:
            commented[match.group(1)] = urlparse(match.group(2))
    assert set(commented) == {"CELERY_BROKER_URL", "EVOLUTION_RABBITMQ_URL"}
    assert commented["CELERY_BROKER_URL"].path != commented["EVOLUTION_RABBITMQ_URL"].path


def test_pyyaml_is_pinned():
    assert re.search(r"^PyYAML==\d", (ROOT / "requirements" / "dev.in").read_text(), re.M)  # only tests read YAML


def test_the_definitions_hold_on_a_real_rabbitmq():
    # The same definitions, imported into the test broker under names of their own, then tried with
    # each user's credentials: what RabbitMQ itself lets each of them do.
    import os
    import tempfile
    import time

    import amqp
    from django.conf import settings

    from tests.support.services import rabbitmqctl

    values = production_values()
    definitions = rabbitmq_definitions(values)
    rename = {name: f"compose_test_{name}" for name in
              [vhost["name"] for vhost in definitions["vhosts"]] + [user["name"] for user in definitions["users"]]}
    for vhost in definitions["vhosts"]:
        vhost["name"] = rename[vhost["name"]]
    for user in definitions["users"]:
        user["name"] = rename[user["name"]]
    for grant in definitions["permissions"]:
        grant["user"], grant["vhost"] = rename[grant["user"]], rename[grant["vhost"]]
    passwords = {user["name"]: user["password"] for user in definitions["users"]}
    broker = urlparse(settings.EVOLUTION_RABBITMQ_URL)

    def try_as(user: str, vhost: str, action: Any) -> bool:
        try:
            connection = amqp.Connection(host=f"{broker.hostname}:{broker.port}", userid=rename[user],
                                         password=passwords[rename[user]], virtual_host=rename[vhost], connect_timeout=5)
            connection.connect()
        except amqp.exceptions.NotAllowed:
            return False
        try:
            action(connection.channel())
            return True
        except amqp.exceptions.AccessRefused:
            return False
        finally:
            try:
                connection.close()
            except Exception:
                pass

    handle, path = tempfile.mkstemp(suffix=".json", dir="/tmp")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(definitions, out)
        os.chmod(path, 0o644)  # the CLI may read it as the broker's user
        rabbitmqctl("import_definitions", path)
        deadline = time.monotonic() + 30  # the import is asynchronous
        while not try_as("celery", "celery", lambda channel: None):
            assert time.monotonic() < deadline, "the definitions were not imported"
            time.sleep(0.5)

        ours = "pilot_status.evolution.ingest"
        assert try_as("evolution", "evolution", lambda ch: (
            ch.exchange_declare("evolution_exchange", "topic", durable=True, auto_delete=False),
            ch.basic_publish(amqp.Message("{}"), exchange="evolution_exchange", routing_key="instance.event")))
        assert try_as("pilot_consumer", "evolution", lambda ch: (
            ch.queue_declare(ours, durable=True, auto_delete=False), ch.queue_bind(ours, "evolution_exchange", "#")))
        for action in (lambda ch: ch.queue_purge(ours), lambda ch: ch.basic_get(ours),
                       lambda ch: ch.queue_delete(ours), lambda ch: ch.queue_declare(ours, durable=True, auto_delete=False)):
            assert not try_as("evolution", "evolution", action)
        assert not try_as("evolution", "celery", lambda channel: None)  # Celery's tasks are out of reach
        assert not try_as("pilot_consumer", "celery", lambda channel: None)
        assert try_as("celery", "celery", lambda ch: ch.queue_declare("otp", durable=True, auto_delete=False))
    finally:
        os.unlink(path)
        for command, names in (("delete_user", passwords), ("delete_vhost", [v["name"] for v in definitions["vhosts"]])):
            for name in names:
                try:
                    rabbitmqctl("-q", command, name)
                except Exception:
                    pass  # not imported


def heartbeat_name(command: list[str]) -> str:
    """The name a service's process writes its heartbeat under (pilot_status.heartbeats' callers)."""
    if command[:3] == ["python", "manage.py", "run_relay"]:
        return "relay:" + command[command.index("--lanes") + 1]
    if command[:3] == ["python", "manage.py", "run_consumer"]:
        return "consumer"
    if command[:4] == ["celery", "-A", "pilot_status", "worker"]:
        return "worker:" + command[command.index("-Q") + 1]
    if command[:4] == ["celery", "-A", "pilot_status", "beat"]:
        return "beat"
    if command[:3] == ["python", "-m", "pilot_status.lane_worker"]:  # a Celery worker on that lane's queue
        return "worker:" + command[3]
    raise AssertionError(f"not a long-running process: {command}")


def test_every_long_running_service_has_a_healthcheck_on_its_own_signal():
    # Issue 24: web and webhook are healthy when /readyz answers; every other process while its heartbeat
    # (the name it writes it under) is fresh.
    services = compose(production_values())["services"]
    ports = {"web": "8000", "webhook": "8001"}
    for name, service in services.items():
        if "build" not in service or service.get("restart") == "no" or "demo" in service.get("profiles", []):
            continue  # infrastructure (own checks), one-shot jobs, the demo
        check = service.get("healthcheck")
        assert check, f"{name} has no healthcheck"
        if name in ports:
            assert check["test"] == ["CMD", "python", "-m", "pilot_status.probe", f"http://127.0.0.1:{ports[name]}/readyz"]
        else:
            assert check["test"] == ["CMD", "python", "-m", "pilot_status.heartbeat_check", "--process",
                                     heartbeat_name(service["command"])], name
            # A heartbeat every HEARTBEAT_SECONDS (5 s) is stale after HEARTBEAT_STALE_SECONDS (30 s): a check
            # every 30 s, three misses, after a minute to start.
            assert check["interval"] == "30s" and check["retries"] == 3 and check["start_period"] == "60s", name
        assert {"interval", "timeout", "retries", "start_period"} <= set(check), name


def test_depends_on_waits_for_health_where_it_matters():
    services = compose(production_values())["services"]
    for name, service in services.items():
        for needed, condition in (service.get("depends_on") or {}).items():
            if condition["condition"] == "service_healthy":
                assert "healthcheck" in services[needed], f"{name} waits for {needed}, which has no healthcheck"
            if "build" in service and name != "setup":
                # Overriding depends_on replaces the anchor's: the migrations must still come first.
                assert "setup" in (service.get("depends_on") or {}) or "seed-demo" in service["depends_on"], name
    assert services["consumer"]["depends_on"]["webhook"] == {"condition": "service_healthy"}
    assert services["simulator"]["depends_on"]["webhook"] == {"condition": "service_healthy"}
    assert services["beat"]["depends_on"]["worker-maintenance"] == {"condition": "service_healthy"}
    assert services["beat"]["depends_on"]["worker-sync"] == {"condition": "service_healthy"}


def test_every_service_keeps_its_logs_bounded():
    # Docker's default json-file driver keeps a container's output forever: a lane worker logging its sends, or a
    # RabbitMQ in an alarm, fills the host's disk, and then Postgres stops. Every service rotates its log.
    services = compose(production_values())["services"]
    for name, service in services.items():
        logging = service.get("logging") or {}
        assert logging.get("driver") == "json-file", name
        options = logging.get("options") or {}
        size, files = options.get("max-size", ""), options.get("max-file", "")
        assert re.fullmatch(r"[1-9][0-9]*m", size) and int(size[:-1]) <= 100, (name, size)
        assert files.isdigit() and 1 <= int(files) <= 10, (name, files)


def test_the_servers_weigh_nice_minus_10_in_compose_and_in_the_services_script():
    # Every hop of an OTP goes through Postgres, Redis and RabbitMQ: on a shared host they serve before any process
    # of ours (bench B3), in compose by their CPU weight, in scripts/services.sh by their nice.
    services = compose(production_values())["services"]
    for name in ("postgres", "redis", "rabbitmq"):
        assert services[name]["cpu_shares"] == 9548, name  # the kernel's weight for nice -10
    script = (ROOT / "scripts" / "services.sh").read_text()
    assert "local nice=${SERVER_NICE:--10}" in script
    for server, pid in (("postgres", "pg_pid"), ("redis", "redis_pid"), ("rabbitmq", "rmq_pid")):
        assert f'server_priority {server} "$({pid})"' in script, server
