"""The production image and the locks it installs from (issue 24, "a lean image"), read as files: the suite
never builds an image, so the Dockerfile is parsed here; `make image-check` builds it and looks inside
(tests/image).

- The image is multi-stage: a builder checks every downloaded file against requirements/runtime.lock's
  hashes; the runtime stage (the default target) holds the product's code and those wheels only, collects
  the static files at build, runs as a user of its own and carries a HEALTHCHECK on /healthz.
- The runtime lock pins every package, indirect ones too, with hashes, and holds no development tool and
  no simulator library; the three locks agree with each other and with the pins they were made from.
- No product module imports a package the runtime lock does not install."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.pilot_status.test_compose import compose
from tests.support.processes import ROOT

PRODUCT = ("pilot_status", "messaging", "ingestion", "dashboard", "callbacks")
NOT_IN_THE_IMAGE = ("tests", "bench", "chaos", "docs", "scripts", "simulator", ".ci")
DEV_TOOLS = ("pytest", "pytest-django", "pytest-timeout", "playwright", "mypy", "django-stubs",
             "djangorestframework-stubs", "schemathesis", "hypothesis", "py-spy", "time-machine", "uv",
             "types-requests", "celery-types")
SIMULATOR_LIBRARIES = ("aiohttp", "aio-pika", "aiormq")


# --- the Dockerfile ------------------------------------------------------------------------------------

@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)  # (INSTRUCTION, arguments)

    def all(self, instruction: str) -> list[str]:
        return [arguments for name, arguments in self.instructions if name == instruction]


def dockerfile_stages(text: str) -> list[Stage]:
    """The Dockerfile's stages in order, each instruction on one line (continuations joined, comments out)."""
    logical, pending = [], ""
    for line in text.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.lstrip().startswith("#"):
            continue  # a comment inside a continued instruction
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        logical.append(pending + line.strip())
        pending = ""
    stages: list[Stage] = []
    build_args: dict[str, str] = {}  # the ARGs before the first FROM, at their defaults
    for line in logical:
        instruction, _, arguments = line.partition(" ")
        instruction, arguments = instruction.upper(), " ".join(arguments.split())
        if instruction == "ARG" and not stages:
            name, _, default = arguments.partition("=")
            build_args[name] = default
        elif instruction == "FROM":
            words = arguments.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: build_args[m.group(1) or m.group(2)], words[0])
            stages.append(Stage(name=name, base=base))
        else:
            assert stages, f"{instruction} before any FROM"
            stages[-1].instructions.append((instruction, arguments))
    return stages


def stages() -> dict[str, Stage]:
    return {stage.name: stage for stage in dockerfile_stages((ROOT / "Dockerfile").read_text())}


def runtime() -> Stage:
    # `docker build` with no --target builds the last stage: that is the image deployments run.
    return dockerfile_stages((ROOT / "Dockerfile").read_text())[-1]


def python_base(stage: str) -> str:
    """The registry image a stage starts from, following FROM <another stage>."""
    named = stages()
    while stage in named:
        stage = named[stage].base
    return stage


def copied_sources(stage: Stage) -> list[str]:
    sources = []
    for arguments in stage.all("COPY"):
        words = [word for word in shlex.split(arguments) if not word.startswith("--")]
        sources += [word.rstrip("/") for word in words[:-1]]
    return sources


def test_the_dockerfile_parser_reads_stages_continuations_and_comments():
    parsed = dockerfile_stages("# c\nARG B=a:1\nFROM ${B} AS one\nRUN x \\\n  # inside\n    && y\nFROM one\nUSER app\n")
    assert [(s.name, s.base) for s in parsed] == [("one", "a:1"), ("1", "one")]
    assert parsed[0].instructions == [("RUN", "x && y")] and parsed[1].all("USER") == ["app"]


def test_the_image_is_multi_stage_and_its_default_target_is_the_runtime():
    named = stages()
    assert {"builder", "runtime"} <= set(named), list(named)
    assert runtime().name == "runtime"
    # Same base in the builder (where the wheels are made) and the runtime (where they are installed): the
    # build argument BASE_IMAGE, python:3.11-slim unless the build names another (scripts/image.sh).
    assert python_base("builder") == python_base("runtime")
    assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?(@sha256:[0-9a-f]{64})?", python_base("runtime"))


def test_the_builder_downloads_only_what_the_runtime_lock_pins_with_its_hashes():
    builder = stages()["builder"]
    installs = [run for run in builder.all("RUN") if "pip " in run]
    assert installs and all("--require-hashes" in run for run in installs)
    assert any("requirements/runtime.lock" in source for source in copied_sources(builder))
    assert re.search(r"pip wheel --require-hashes .*-r \S*runtime\.lock", " ".join(installs))


def test_the_runtime_installs_the_builders_wheels_and_nothing_from_an_index():
    stage = runtime()
    pip_runs = [run for run in stage.all("RUN") if re.search(r"\bpip\b", run)]
    assert len(pip_runs) == 1, pip_runs
    assert "--no-index" in pip_runs[0] and "from=builder,source=/wheels/runtime" in pip_runs[0]
    every = [arguments for stage in stages().values() for _, arguments in stage.instructions]
    assert not [arguments for arguments in every if "requirements.txt" in arguments]  # the locks, not the pins


def test_the_runtime_copies_the_product_and_none_of_the_bench():
    sources = copied_sources(runtime())
    # gunicorn.conf.py: the multiprocess metrics hook (a dead worker's histograms are marked as gone).
    assert sorted(sources) == sorted([*PRODUCT, "manage.py", "gunicorn.conf.py"])
    for source in sources:
        assert source.split("/")[0] not in NOT_IN_THE_IMAGE, source
    assert "." not in sources  # never the whole context
    # ... and the build context leaves them out too (a smaller context, no .env or .state secrets).
    ignored = {line.strip().rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {"tests", "bench", "chaos", "docs", ".env", ".state", ".venv", ".git"} <= ignored


def test_the_runtime_collects_static_files_at_build():
    stage = runtime()
    assert any(re.search(r"\bpython manage\.py collectstatic --noinput\b", run) for run in stage.all("RUN"))
    assert any("STATIC_ROOT=" in env for env in stage.all("ENV"))


def test_the_runtime_runs_as_an_unprivileged_user():
    users = runtime().all("USER")
    assert users, "no USER: the processes would run as root"
    assert users[-1].split(":")[0] not in {"root", "0"}
    order = [instruction for instruction, _ in runtime().instructions]
    last_user = len(order) - 1 - order[::-1].index("USER")
    assert "RUN" not in order[last_user:] and "CMD" in order[last_user:]  # the user every process gets


def test_the_runtime_has_a_healthcheck_on_healthz_like_composes():
    checks = runtime().all("HEALTHCHECK")
    assert len(checks) == 1
    check = checks[0]
    assert re.search(r"CMD python -m pilot_status\.probe \S*http://127\.0\.0\.1:\$\{PORT\}/healthz", check)
    options = dict(re.findall(r"--([a-z-]+)=(\S+)", check.split(" CMD ")[0]))
    ready = compose()["x-ready-probe"]  # web's and webhook's probe in docker-compose.yml
    assert options == {"interval": ready["interval"], "timeout": ready["timeout"],
                       "start-period": ready["start_period"], "retries": str(ready["retries"])}


def test_compose_builds_the_runtime_and_the_simulator_from_their_own_targets():
    services = compose()["services"]
    for name, service in services.items():
        if "build" in service:
            expected = "simulator" if name == "simulator" else "runtime"
            assert service["build"] == {"context": ".", "target": expected}, name
            assert expected in stages()
    assert services["simulator"]["image"] != services["web"]["image"]


# --- the locks -------------------------------------------------------------------------------------------

def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    """`name==version` lines of a requirements file (extras and comments dropped), by canonical name."""
    found = {}
    for line in path.read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^]]*\])?==([^\s;\\#]+)", line)
        if match:
            found[canonical(match.group(1))] = match.group(3)
    return found


def lock_entries(path: Path) -> dict[str, list[str]]:
    """`make lock`'s output: each pinned package with the hashes on its continuation lines."""
    entries: dict[str, list[str]] = {}
    current = None
    for line in path.read_text().splitlines():
        if re.match(r"^[A-Za-z0-9]", line):
            name = canonical(line.split("==")[0].split("[")[0])
            assert "==" in line, f"{path.name}: {line!r} is not pinned"
            current, entries[name] = name, []
        elif line.strip().startswith("--hash=") and current:
            entries[current].append(line.strip())
        elif not line.startswith("    ") and not line.strip().startswith("#") and line.strip():
            raise AssertionError(f"{path.name}: unexpected line {line!r}")
    return entries


LOCKS = ROOT / "requirements"


@pytest.mark.parametrize("lock", ["runtime.lock", "simulator.lock", "dev.lock"])
def test_every_package_of_each_lock_is_pinned_with_hashes(lock):
    entries = lock_entries(LOCKS / lock)
    assert entries
    for name, hashes in entries.items():
        assert hashes and all(re.fullmatch(r"--hash=sha256:[0-9a-f]{64}( \\)?", h) for h in hashes), name
    text = (LOCKS / lock).read_text()
    assert "--index-url" not in text and "--find-links" not in text and "/opt/" not in text  # no machine paths


def test_the_runtime_lock_holds_no_development_tool_and_no_simulator_library():
    runtime_lock = pins(LOCKS / "runtime.lock")
    assert not {canonical(name) for name in DEV_TOOLS} & set(runtime_lock)
    assert not {canonical(name) for name in SIMULATOR_LIBRARIES} & set(runtime_lock)
    assert not [name for name in runtime_lock if name.startswith(("pytest", "types-")) or name.endswith("-stubs")]


def test_the_requirements_name_the_tools_where_they_belong():
    runtime_pins, dev_pins = pins(ROOT / "requirements.txt"), pins(LOCKS / "dev.in")
    assert not {canonical(name) for name in (*DEV_TOOLS, *SIMULATOR_LIBRARIES)} & set(runtime_pins)
    assert {canonical(name) for name in DEV_TOOLS} <= set(dev_pins)
    assert set(pins(LOCKS / "simulator.in")) == {canonical(name) for name in SIMULATOR_LIBRARIES}


@pytest.mark.parametrize("source, lock", [("../requirements.txt", "runtime.lock"), ("simulator.in", "simulator.lock"),
                                          ("dev.in", "dev.lock"), ("../requirements.txt", "dev.lock"),
                                          ("simulator.in", "dev.lock")])
def test_the_locks_are_up_to_date_with_the_pins_they_were_made_from(source, lock):
    # Editing a pin without `make lock` leaves the lock installing the old version: caught here.
    wanted, locked = pins((LOCKS / source).resolve()), pins(LOCKS / lock)
    stale = {name: (version, locked.get(name)) for name, version in wanted.items() if locked.get(name) != version}
    assert not stale, f"{lock} is stale (run `make lock`): {stale}"


@pytest.mark.parametrize("lock", ["runtime.lock", "simulator.lock"])
def test_the_dev_lock_has_the_same_versions_as_the_images(lock):
    # .venv (tests, bench, chaos) runs what the images run.
    dev, image = pins(LOCKS / "dev.lock"), pins(LOCKS / lock)
    assert {name: version for name, version in image.items() if dev.get(name) != version} == {}


# --- imports -----------------------------------------------------------------------------------------------

def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_no_product_module_imports_a_package_the_runtime_lock_does_not_install():
    files = [ROOT / "manage.py", *(path for package in PRODUCT for path in (ROOT / package).rglob("*.py"))]
    third_party: dict[str, set[str]] = {}
    for path in files:
        for module in imported_modules(path) - set(sys.stdlib_module_names) - {*PRODUCT, "__future__"}:
            third_party.setdefault(module, set()).add(str(path.relative_to(ROOT)))
    assert {"django", "rest_framework", "celery"} <= set(third_party)  # the scan sees imports
    distributions = importlib.metadata.packages_distributions()
    runtime_lock = set(pins(LOCKS / "runtime.lock"))
    missing = {module: sorted(where)[:3] for module, where in third_party.items()
               if not {canonical(name) for name in distributions.get(module, [])} & runtime_lock}
    assert not missing, f"imported by the product but not in requirements/runtime.lock: {missing}"
