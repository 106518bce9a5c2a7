"""The built runtime image, looked at from inside (`make image-check`; tests/pilot_status/test_image.py reads the
Dockerfile itself): it holds exactly the runtime lock's Python packages and no development tool, the product's
code only, the static files collected at build, runs as the unprivileged user `app`, and carries the
HEALTHCHECK on /healthz."""

from __future__ import annotations

import json
import re

from tests.pilot_status.test_image import DEV_TOOLS, PRODUCT, SIMULATOR_LIBRARIES, canonical
from tests.pilot_status.test_lock_closure import LOCKS, applies, read_lock, target_environment

LIST_DISTRIBUTIONS = ("import importlib.metadata as m, json, platform; print(json.dumps({'python': "
                      "platform.python_version(), 'machine': platform.machine(), 'packages': sorted("
                      "[d.metadata['Name'], d.version] for d in m.distributions())}))")


def installed(image) -> dict:
    result = image.run(["python", "-c", LIST_DISTRIBUTIONS], env={})
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_image_holds_exactly_the_runtime_locks_packages_and_no_development_tool(image):
    found = installed(image)
    packages = {canonical(name): version for name, version in found["packages"]}
    environment = target_environment(found["python"], found["machine"])
    wanted = {name: entry.version for name, entry in read_lock(LOCKS / "runtime.lock").items()
              if applies(entry.marker, environment)}
    print(f"\nPython {found['python']} on {found['machine']}: {len(packages)} distributions in the image")
    for name, version in sorted(packages.items()):
        print(f"  {name}=={version}{'' if wanted.get(name) == version else '   <- not the runtime lock'}")
    assert packages == wanted, {"not in the lock": sorted(set(packages) - set(wanted)),
                                "missing": sorted(set(wanted) - set(packages)),
                                "other version": sorted(n for n in set(packages) & set(wanted) if packages[n] != wanted[n])}
    tools = {canonical(name) for name in (*DEV_TOOLS, *SIMULATOR_LIBRARIES, "pip", "setuptools", "pip-tools", "wheel")}
    assert not tools & set(packages)
    assert not [name for name in packages if name.startswith(("pytest", "types-")) or name.endswith("-stubs")]


def test_the_image_holds_the_product_code_and_the_collected_static_files_only(image):
    result = image.run(["sh", "-c", "cd /app && ls -A && echo --- && ls staticfiles && echo --- && "
                        "ls staticfiles/admin/css/base.css staticfiles/drf_spectacular_sidecar/swagger-ui-dist/"
                        "swagger-ui-bundle.js && echo --- && stat -c '%U' .state"], env={})
    assert result.returncode == 0, result.stderr
    top, static, files, state_owner = result.stdout.split("---\n")
    assert sorted(top.split()) == sorted([*PRODUCT, "manage.py", "gunicorn.conf.py", "staticfiles", ".state"])
    assert {"admin", "drf_spectacular_sidecar", "rest_framework"} <= set(static.split())
    assert len(files.split()) == 2 and state_owner.strip() == "app"
    # nothing compiled on the build machine came in with the code (.dockerignore)
    compiled = image.run(["find", "/app", "-name", "*.pyc", "-o", "-name", "__pycache__"], env={})
    assert compiled.returncode == 0 and compiled.stdout.split() == [], compiled.stdout[:500]


def test_the_image_runs_as_app_and_carries_the_healthcheck(image):
    config = image.config()
    assert config["User"] == "app"
    who = image.run(["id", "-u", "-n"], env={})
    assert who.returncode == 0 and who.stdout.split() == ["app"], (who.stdout, who.stderr)
    uid = image.run(["id", "-u"], env={})
    assert uid.stdout.strip() == "10001"
    check = config["Healthcheck"]
    assert re.search(r"python -m pilot_status\.probe \S*http://127\.0\.0\.1:\$\{PORT\}/healthz", " ".join(check["Test"]))
    # Docker's format keeps durations in nanoseconds: 10 s, 6 s, 30 s, as the Dockerfile says.
    assert (check["Interval"], check["Timeout"], check["StartPeriod"], check["Retries"]) == (10 * 10**9, 6 * 10**9,
                                                                                          30 * 10**9, 3)
