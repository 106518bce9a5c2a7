"""Process priorities are the deployment's (scripts/launch.sh, deploy/systemd, compose): no module of the product
changes the kernel's scheduling, writes to /proc or to a cgroup."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("messaging", "ingestion", "pilot_status", "dashboard", "callbacks")
SCHEDULING = {"setpriority", "nice", "sched_setaffinity", "sched_setscheduler", "sched_setparam"}
KERNEL_PATHS = ("/sys/fs/cgroup", "/proc/self/autogroup", "cgroup.procs", "cpu.weight", "cpu.idle", "subtree_control")


def product_modules() -> list[Path]:
    return [path for package in PRODUCT for path in sorted((ROOT / package).rglob("*.py"))]


def kernel_tuning(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os" and (
                node.attr.startswith("sched_") or node.attr in SCHEDULING):
            found.append(f"os.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [f"from os import {a.name}" for a in node.names
                      if a.name.startswith("sched_") or a.name in SCHEDULING]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found += [path for path in KERNEL_PATHS if path in node.value]
    return found


def test_the_check_finds_each_way_of_tuning_the_kernel():
    assert kernel_tuning("import os\nos.sched_setaffinity(0, {1})\nos.setpriority(0, 0, 10)") == [
        "os.sched_setaffinity", "os.setpriority"]
    assert kernel_tuning("from os import sched_getaffinity") == ["from os import sched_getaffinity"]
    assert kernel_tuning("open('/sys/fs/cgroup/x/cgroup.procs', 'w')") == ["/sys/fs/cgroup", "cgroup.procs"]
    assert kernel_tuning("Path('/proc/self/autogroup').write_text('10')") == ["/proc/self/autogroup"]
    assert kernel_tuning("import os\nos.getpid()") == []


def test_no_product_module_tunes_the_kernel():
    found = {str(path.relative_to(ROOT)): kernel_tuning(path.read_text()) for path in product_modules()}
    assert {path: calls for path, calls in found.items() if calls} == {}
    assert not (ROOT / "pilot_status" / "priority.py").exists()
