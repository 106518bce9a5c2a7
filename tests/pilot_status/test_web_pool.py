"""The client API's pool size comes from one place, WEB_CONCURRENCY (one sync worker per core by default),
wherever the web process is started: `make run`, the image, compose and the bench."""

from __future__ import annotations

import os
import subprocess

import yaml

from tests.pilot_status.test_launcher import procfile
from tests.support.processes import ROOT


def test_every_way_of_starting_web_sizes_it_by_web_concurrency():
    assert " -w ${WEB_CONCURRENCY:-2} " in procfile()["web"]
    assert " -w ${WEB_CONCURRENCY:-$(nproc)} " in (ROOT / "Dockerfile").read_text()
    web = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["web"]
    assert " -w $${WEB_CONCURRENCY:-$$(nproc)} " in web["command"][-1]


def test_the_default_is_one_worker_per_core():
    env = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root")}
    shown = subprocess.run(["bash", str(ROOT / "scripts" / "env.sh"), "--test"], env=env, capture_output=True, text=True,
                           check=True, cwd=ROOT).stdout
    assert f"WEB_CONCURRENCY={len(os.sched_getaffinity(0))}" in shown.splitlines()  # as nproc counts


def test_the_bench_runs_web_as_the_procfile_does(monkeypatch):
    from bench.__main__ import parse

    monkeypatch.delenv("BENCH_WEB_WORKERS", raising=False)
    monkeypatch.setenv("WEB_CONCURRENCY", "3")
    assert parse([]).web_workers == 3
