"""The commands `make run` and the README print work as printed, in a new shell (issue 24).

A user pastes `python3 manage.py create_project ...` into a shell that has neither the virtualenv nor
scripts/env.sh's variables: manage.py finds both by itself. Each line runs here under `env -i` (only
PATH, with a python3 that has no Django first) in a copy of the checkout whose `.env` points at the test
database, Redis and broker (a new clone's .env would hold the user's own), never the development ones.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from messaging.models import Instance, Project
from tests.support import processes
from tests.support.processes import ROOT

PACKAGES = ("pilot_status", "messaging", "ingestion", "dashboard", "callbacks", "simulator", ".venv")
SYSTEM_PATH = "/usr/bin:/bin"


@functools.cache
def shell_path() -> str:
    """A new shell's PATH whose python3 has no Django whatever the system's has: a bare virtualenv of the system's
    python3 first (without --system-site-packages), so manage.py must find the project's .venv itself."""
    python3 = shutil.which("python3", path=SYSTEM_PATH)
    assert python3 is not None, f"no python3 on {SYSTEM_PATH}"
    bare = Path(tempfile.mkdtemp(prefix="bare-python-")) / "venv"
    subprocess.run([python3, "-m", "venv", "--without-pip", str(bare)], check=True, capture_output=True)
    return f"{bare / 'bin'}:{SYSTEM_PATH}"


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A checkout as a user has it after `make run`: its own manage.py, scripts and .env (here naming the
    test services), and the packages and virtualenv of this one."""
    root = tmp_path / "pilot-status"
    root.mkdir()
    shutil.copy2(ROOT / "manage.py", root / "manage.py")
    shutil.copytree(ROOT / "scripts", root / "scripts")
    for name in PACKAGES:
        (root / name).symlink_to(ROOT / name)
    (root / ".state").mkdir()
    if (ROOT / ".state" / "port-offset").exists():  # this clone's services run on shifted ports
        shutil.copy2(ROOT / ".state" / "port-offset", root / ".state" / "port-offset")
    values = {
        "DATABASE_URL": processes.test_database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "EVOLUTION_RABBITMQ_URL": settings.EVOLUTION_RABBITMQ_URL,
        "EVOLUTION_API_URL": settings.EVOLUTION_API_URL,
    }
    (root / ".env").write_text("".join(f"{name}={value}\n" for name, value in values.items()))
    return root


def run_printed(clone: Path, line: str) -> subprocess.CompletedProcess[str]:
    """`line` as a user pastes it, in a new shell with no variables but PATH."""
    assert line.startswith("python3 manage.py "), line
    return subprocess.run(
        ["/usr/bin/env", "-i", f"PATH={shell_path()}", "bash", "--noprofile", "--norc", "-c", line],
        cwd=clone, capture_output=True, text=True, timeout=120,
    )


def succeed(clone: Path, line: str) -> str:
    result = run_printed(clone, line)
    assert result.returncode == 0, f"{line}\nstdout: {result.stdout}\nstderr: {result.stderr}"
    return result.stdout


def test_python3_in_a_new_shell_is_not_the_projects_interpreter() -> None:
    # What makes the test honest: the shell's python3 has no Django, so manage.py must find .venv itself.
    python3 = shutil.which("python3", path=shell_path())
    assert python3 is not None
    probe = subprocess.run([python3, "-c", "import django"], env={"PATH": shell_path()}, capture_output=True)
    assert probe.returncode != 0, f"{python3} imports Django: the interpreter part would not be exercised"


def test_the_readmes_operator_commands_work_as_printed(clone: Path, transactional_db: Any) -> None:
    readme = (ROOT / "README.md").read_text()
    printed = [line.split("   #")[0].strip() for line in readme.splitlines() if line.startswith("python3 manage.py ")]
    assert [line.split()[2] for line in printed] == ["create_project", "add_instance", "create_member"], printed

    created = json.loads(succeed(clone, printed[0]))
    project = Project.objects.get(pk=created["project_id"])
    assert project.name == "My shop"
    # The README names project 1 and placeholders; a user writes their own values in their place.
    add_instance = printed[1].replace("--project 1", f"--project {project.pk}").replace(
        "<evolution instance token>", "evo-instance-token")
    succeed(clone, add_instance)
    assert Instance.objects.get(name="my-shop-1").project_id == project.pk
    create_member = printed[2].replace("--project 1", f"--project {project.pk}").replace("'...'", "'a long password'")
    user_id = json.loads(succeed(clone, create_member))["user_id"]
    from django.contrib.auth import get_user_model

    assert get_user_model().objects.get(pk=user_id).username == "ana"


def test_the_lines_make_run_prints_work_as_printed(clone: Path, transactional_db: Any) -> None:
    # make run: seed_demo through scripts/env.sh; then every manage.py line it printed, in a new shell.
    output = succeed(clone, f"python3 manage.py seed_demo --i-know-this-is-a-demo --state-dir {shlex.quote(str(clone / '.state'))}")
    lines = [match.group(0) for match in re.finditer(r"python3 manage\.py [a-z_]+[^)\n]*", output)]
    assert [line.split()[2] for line in lines] == ["createsuperuser"], output
    for line in lines:
        # createsuperuser asks for a password on a terminal; the same line without one, as a script would.
        succeed(clone, line + " --noinput --username admin --email admin@example.com")
    from django.contrib.auth import get_user_model

    assert get_user_model().objects.filter(username="admin", is_superuser=True).exists()


def test_a_process_that_names_its_database_gets_no_development_defaults(clone: Path, transactional_db: Any) -> None:
    # A deployment always names its database: then manage.py adds nothing, and production mode still
    # refuses a missing secret instead of running on a development one.
    result = subprocess.run(
        ["/usr/bin/env", "-i", f"PATH={shell_path()}", "DATABASE_URL=postgres://nobody:x@127.0.0.1:1/none",
         "bash", "-c", "python3 manage.py create_project --name X --test-number +5511999990000"],
        cwd=clone, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr or "Refusing to start" in result.stderr, result.stderr
    assert not Project.objects.filter(name="X").exists()
