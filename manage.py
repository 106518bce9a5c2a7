#!/usr/bin/env python3
"""Django's manage.py, which finds the project's interpreter and development settings by itself.

The commands `make run` and the README print (`python3 manage.py createsuperuser`, `create_project`, ...)
are pasted into a new shell, which has neither the virtualenv activated nor scripts/env.sh's variables
(issue 24). So, in a checkout:
- run by another interpreter than the checkout's `.venv`, it re-runs itself with `.venv/bin/python`;
- without DATABASE_URL in the environment, it takes the variables scripts/env.sh would set, with the same
  precedence: a non-empty value in the environment wins, then `.env`, then the development defaults
  (including this clone's random secrets in .state/dev-secrets).
A deployment (compose, Kubernetes, systemd) always names its database, and no process starts without one,
so this never changes how a configured process runs; in particular it never hands a production process
a secret it was not given (production mode still refuses a missing one). `PILOT_STATUS_DEV_ENV=0` turns
both off.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(os.path.abspath(__file__)).parent
ENV_SCRIPT = ROOT / "scripts" / "env.sh"
VENV = ROOT / ".venv"


def _use_the_checkouts_interpreter() -> None:
    python = VENV / "bin" / "python"
    if not python.exists() or os.environ.get("PILOT_STATUS_DEV_ENV") == "0":
        return
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    os.execv(str(python), [str(python), os.path.abspath(__file__), *sys.argv[1:]])


def _load_development_environment() -> None:
    if os.environ.get("DATABASE_URL") or os.environ.get("PILOT_STATUS_DEV_ENV") == "0" or not ENV_SCRIPT.exists():
        return
    try:
        # `env -0` in scripts/env.sh's environment: every variable, values with newlines included.
        printed = subprocess.run(
            ["bash", str(ENV_SCRIPT), "env", "-0"], check=True, capture_output=True, timeout=30
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"manage.py: scripts/env.sh failed ({exc}); using the environment as it is", file=sys.stderr)
        return
    for line in printed.split(b"\0"):
        name, separator, value = line.partition(b"=")
        if separator and name and not os.environb.get(name):
            os.environb[name] = value


def main() -> None:
    _use_the_checkouts_interpreter()
    _load_development_environment()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pilot_status.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
