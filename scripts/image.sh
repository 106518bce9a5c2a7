#!/usr/bin/env bash
# The production image (Dockerfile), built and measured on this machine.
#
#   scripts/image.sh build     `make image`: docker where a daemon answers, else buildah (podman's builder)
#   scripts/image.sh base      the base made from Debian's packages (below), when it is missing
#   scripts/image.sh tool      prints the builder in use: docker or buildah
#   scripts/image.sh size      the image's size in MB (what `docker image ls` / `podman images` show)
#
# IMAGE (default pilot-status:local) names the result. BASE_IMAGE is the Dockerfile's build argument: with
# docker, or when set, it is used as given (python:3.11-slim by default, pulled from the registry). Without
# docker and unset, the registry is asked first; where it does not answer (a machine that reaches only
# Debian's and PyPI's packages), the base is made from Debian's packages: mmdebstrap --variant=minbase
# BASE_SUITE (bookworm: Python 3.11) with python3, python3-venv, ca-certificates, netbase and tzdata, piped into
# `podman import` as localhost/pilot-status-base:BASE_SUITE. buildah builds with --isolation chroot (no
# namespaces or cgroups needed: it runs in a container or a chroot too) and --format docker, which keeps the
# HEALTHCHECK (the OCI format has none). Needs root for apt-get, mmdebstrap and the image store.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
IMAGE=${IMAGE:-pilot-status:local}
BASE_SUITE=${BASE_SUITE:-bookworm}
LOCAL_BASE=localhost/pilot-status-base:$BASE_SUITE
DEFAULT_BASE=python:3.11-slim
MIRROR=${BASE_MIRROR:-http://deb.debian.org/debian}

say() { printf 'image: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

tool() {
    if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
        echo docker
    else
        echo buildah
    fi
}

ensure_buildah() {
    command -v buildah >/dev/null && command -v podman >/dev/null && return 0
    "$ROOT/scripts/services.sh" apt-ensure buildah podman
}

# registry_answers: Docker Hub's registry answers (401 without a token is an answer).
registry_answers() {
    local code
    code=$(curl -s -o /dev/null -m 10 -w '%{http_code}' https://registry-1.docker.io/v2/ 2>/dev/null) || true
    [ "$code" = 401 ] || [ "$code" = 200 ]
}

cmd_base() {
    ensure_buildah
    if podman image exists "$LOCAL_BASE"; then
        say "base $LOCAL_BASE is there"
        return 0
    fi
    command -v mmdebstrap >/dev/null || "$ROOT/scripts/services.sh" apt-ensure mmdebstrap
    local t0=$SECONDS
    say "making $LOCAL_BASE from Debian $BASE_SUITE's packages (mmdebstrap, then podman import)"
    # No manual pages, translations or documentation but the licences (as Debian's slim images): about 50 MB.
    mmdebstrap --quiet --variant=minbase --mode=root --include=python3,python3-venv,ca-certificates,netbase,tzdata \
        --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
        --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
        "$BASE_SUITE" - "$MIRROR" | podman import --change 'CMD ["/bin/bash"]' - "$LOCAL_BASE" >/dev/null
    say "base $LOCAL_BASE made in $((SECONDS - t0)) s"
}

base_image() { # the BASE_IMAGE to build with (for buildah)
    if [ -n "${BASE_IMAGE:-}" ]; then
        echo "$BASE_IMAGE"
    elif podman image exists "$DEFAULT_BASE" || registry_answers; then
        echo "$DEFAULT_BASE"
    else
        say "no registry answers: the base is made from Debian's packages"
        cmd_base
        echo "$LOCAL_BASE"
    fi
}

cmd_build() {
    local t0=$SECONDS builder base secret=()
    builder=$(tool)
    cd "$ROOT"
    # A host whose pip needs its own TLS authorities (PIP_CERT) hands them to the builder stage's downloads.
    [ -n "${PIP_CERT:-}" ] && [ -s "$PIP_CERT" ] && secret=(--secret "id=pip_cert,src=$PIP_CERT")
    if [ "$builder" = docker ]; then
        base=${BASE_IMAGE:-$DEFAULT_BASE}
        say "docker build (base $base) -> $IMAGE"
        DOCKER_BUILDKIT=1 docker build "${secret[@]}" --build-arg "BASE_IMAGE=$base" --target runtime -t "$IMAGE" .
    else
        ensure_buildah
        base=$(base_image)
        # No --layers: buildah's layer cache keys a RUN by its text, not by what its `--mount=type=bind,from=builder`
        # brings in, so a changed lock would reuse the runtime's old packages (it did: cryptography was missing).
        say "buildah bud --isolation chroot (base $base) -> $IMAGE"
        buildah bud --isolation chroot --format docker "${secret[@]}" \
            --build-arg "BASE_IMAGE=$base" --target runtime -t "$IMAGE" -f Dockerfile . >&2
    fi
    say "$IMAGE built in $((SECONDS - t0)) s with $builder: $(cmd_size) MB"
}

cmd_size() {
    local bytes
    if [ "$(tool)" = docker ]; then
        bytes=$(docker image inspect --format '{{.Size}}' "$IMAGE")
    else
        bytes=$(podman image inspect --format '{{.Size}}' "$IMAGE")
    fi
    echo $(((bytes + 500000) / 1000000))
}

case "${1:-}" in
build) cmd_build ;;
base) cmd_base ;;
tool) tool ;;
size) cmd_size ;;
*) sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
