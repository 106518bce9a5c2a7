"""Running the built image (`make image-check`: PILOT_STATUS_IMAGE names it, IMAGE_TOOL is docker or buildah).

Each process runs in a container of its own on the host's network, so that it reaches this checkout's Postgres,
Redis and RabbitMQ and the simulator on loopback as a deployment reaches its servers: `docker run --network host`
where a daemon answers, else `podman run --network host`, else (where this machine refuses podman's namespaces)
`buildah run --isolation chroot` in a working container made from the image (`buildah from`). The command,
user, working directory and PATH are the image's own in every case; the environment is passed in full.
"""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from functools import cached_property

import pytest

# The host's own process state, which means nothing inside the image.
NOT_PASSED = {"PATH", "HOME", "HOSTNAME", "PWD", "OLDPWD", "SHLVL", "_", "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME",
              "USER", "LOGNAME", "SHELL", "MAIL", "TERM", "PROMETHEUS_MULTIPROC_DIR", "PS_TEST_LOG_DIR", "TMPDIR"}


class ImageRunner:
    def __init__(self, image: str, tool: str):
        self.image = image
        self.tool = tool
        self.containers: list[str] = []

    @cached_property
    def runner(self) -> str:
        """docker, podman or buildah: the first that runs a command from the image here."""
        if self.tool == "docker":
            return "docker"
        probe = subprocess.run(["podman", "run", "--rm", "--network", "host", self.image, "true"],
                               capture_output=True, text=True, timeout=120)
        return "podman" if probe.returncode == 0 else "buildah"

    def config(self) -> dict:
        """The image's configuration (User, Healthcheck, Env, Cmd, WorkingDir) as docker's format has it."""
        tool = "docker" if self.tool == "docker" else "podman"
        out = subprocess.run([tool, "image", "inspect", self.image], capture_output=True, text=True, check=True)
        inspected = json.loads(out.stdout)[0]
        config = inspected.get("Config") or {}
        if "Healthcheck" not in config and inspected.get("Healthcheck"):
            config["Healthcheck"] = inspected["Healthcheck"]
        return config

    def argv(self, command: list[str], env: dict[str, str]) -> list[str]:
        """The host command that runs `command` from the image with `env`."""
        passed = {name: value for name, value in env.items() if name not in NOT_PASSED}
        env_flags = [flag for name, value in sorted(passed.items()) for flag in ("--env", f"{name}={value}")]
        if self.runner in ("docker", "podman"):
            return [self.runner, "run", "--rm", "--network", "host", *env_flags, self.image, *command]
        name = f"pilot-status-check-{uuid.uuid4().hex[:8]}"
        subprocess.run(["buildah", "from", "--name", name, self.image], capture_output=True, check=True)
        self.containers.append(name)
        return ["buildah", "run", "--isolation", "chroot", *env_flags, name, "--", *command]

    def run(self, command: list[str], env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(command, env if env is not None else dict(os.environ)),
                              capture_output=True, text=True, timeout=timeout)

    def remove_containers(self) -> None:
        for name in self.containers:
            subprocess.run(["buildah", "rm", name], capture_output=True)
        self.containers.clear()


@pytest.fixture(scope="session")
def image() -> Iterator[ImageRunner]:
    runner = ImageRunner(os.environ["PILOT_STATUS_IMAGE"], os.environ.get("IMAGE_TOOL", "buildah"))
    yield runner
    runner.remove_containers()
