#!/usr/bin/env bash
# `make fresh-check`: the README's two commands on machines nobody prepared. For each Debian suite, a new
# minimal root (debootstrap --variant=minbase) with only what a newcomer brings (git, make, curl, the CA
# certificates and the distribution's own python3), this checkout's committed HEAD cloned into it, then,
# inside it (chroot): `make test` (the whole suite), and `make run` until the API answers (/healthz on both
# pools, then the curl line the demo prints, which must be accepted: 202). Run as root on Debian/Ubuntu:
#
#   scripts/fresh-check.sh [SUITE...]          (default: bookworm trixie, i.e. Debian 12 and 13)
#   FRESH_DIR=/var/tmp/x   where the roots, logs and the .deb cache live (default below); a suite's root is
#                          deleted and made anew on every run, the downloaded .deb files are kept
#   FRESH_MIRROR=URL       the Debian mirror (default: this machine's apt source, else deb.debian.org)
#   FRESH_KEEP=1           keep the roots afterwards (to look inside); FRESH_TEST_ARGS="..." for make test
#
# The root shares this machine's network and /proc: its Postgres, Redis and RabbitMQ choose free ports as
# every checkout's do (scripts/services.sh choose_ports), so it runs beside other checkouts' servers. `make
# run`'s own ports (web 8000, webhook 8001; the simulator's 8081) are fixed: when 8000 or 8001 is taken here,
# the check gives `make run` a free PORT (the environment wins over the defaults) and says so; 8081 must be
# free. The machine's TLS authorities go in with the resolver (a TLS-inspecting proxy would refuse pip
# otherwise) and PIP_CERT points pip at them; no pip configuration of this machine is copied: pip reads PyPI.
# One line per suite ends in $FRESH_DIR/results.txt; the logs are $FRESH_DIR/<suite>.{debootstrap,test,run}.log.
set -uo pipefail

FRESH_DIR=${FRESH_DIR:-/var/tmp/pilot-status-fresh}
CHECKOUT=$(git -C "$(dirname "${BASH_SOURCE[0]}")/.." rev-parse --show-toplevel) || exit 2
SUITES=("$@")
[ ${#SUITES[@]} -gt 0 ] || SUITES=(bookworm trixie)
BASE_TOOLS="git make curl ca-certificates python3"
CHROOT_PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

say() { printf 'fresh-check: %s\n' "$*"; }
die() { say "$*" >&2; exit 2; }

[ "$(id -u)" = 0 ] || die "must run as root (debootstrap, chroot, mount)"
if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap </dev/null >/dev/null ||
        { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap </dev/null >/dev/null; } ||
        die "debootstrap could not be installed"
fi

mirror=${FRESH_MIRROR:-}
[ -n "$mirror" ] || mirror=$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n1)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list 2>/dev/null)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

port_listening() { # PORT: something listens on it (read from /proc, as scripts/services.sh does)
    local hex
    hex=$(printf ':%04X' "$1")
    awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
        /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# root_argv ROOT CMD: the argv that runs CMD (a bash string) in ROOT with a clean, minimal environment
# (RUN_ENV adds NAME=VALUE words); in_root runs it.
root_argv() {
    ROOT_ARGV=(chroot "$1" /usr/bin/env -i HOME=/root PATH="$CHROOT_PATH" LANG=C.UTF-8 TERM=dumb
        PIP_CERT=/etc/ssl/certs/ca-certificates.crt "${RUN_ENV[@]}" /bin/bash -c "$2")
}
in_root() { root_argv "$1" "$2"; "${ROOT_ARGV[@]}"; }

# /sys and /dev with what is mounted below them (the cgroup filesystem, /dev/pts), as a booted machine has them;
# rslave, so that unmounting them here never reaches the host's own.
mount_all() {
    local root=$1 m
    mount --bind /proc "$root/proc"
    for m in sys dev; do
        mount --rbind "/$m" "$root/$m" && mount --make-rslave "$root/$m"
    done
}
# kill_leftovers ROOT: every process still running inside ROOT (chrooted there), ended by its PID: a test stack
# whose start failed halfway, say, leaves its other processes running after `make test` and `make stop`.
kill_leftovers() {
    local root=$1 sig p pids
    for sig in TERM KILL; do
        pids=""
        for p in /proc/[0-9]*; do
            [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && pids="$pids ${p#/proc/}"
        done
        [ -n "$pids" ] || return 0
        [ "$sig" = TERM ] && say "ending what still runs inside $root:$pids"
        # shellcheck disable=SC2086 # one PID per word
        kill -"$sig" $pids 2>/dev/null
        sleep 5
    done
}

unmount_all() {
    local root=$1 m
    for m in dev sys proc; do umount -R -l "$root/$m" 2>/dev/null; done
}

# run_until_answered ROOT LOG: `make run` in the background (a session of its own), until /healthz answers on
# both pools and the send the demo prints (its curl line, run as printed) is accepted and reaches SENT or later;
# then Ctrl-C to honcho and `make stop`.
run_until_answered() {
    local root=$1 log=$2 port=8000 pid deadline line answer code id status="" rc=1
    if port_listening 8000 || port_listening 8001; then
        port=18000
        while port_listening "$port" || port_listening $((port + 1)); do port=$((port + 10)); done
        say "ports 8000/8001 are taken on this machine: make run gets PORT=$port" | tee -a "$log"
    fi
    if port_listening 8081; then
        say "port 8081 (the simulator's) is taken on this machine: make run cannot be checked" | tee -a "$log"
        return 1
    fi
    RUN_ENV=()
    [ "$port" = 8000 ] || RUN_ENV=("PORT=$port")
    root_argv "$root" "cd /srv/pilot-status && exec make run"
    setsid "${ROOT_ARGV[@]}" </dev/null >>"$log" 2>&1 &
    pid=$!
    deadline=$((SECONDS + 900))
    until curl -fsS -m 3 "http://127.0.0.1:$port/healthz" >/dev/null 2>&1 &&
        curl -fsS -m 3 "http://127.0.0.1:$((port + 1))/healthz" >/dev/null 2>&1 &&
        curl -fsS -m 3 "http://127.0.0.1:8081/" >/dev/null 2>&1; do
        if [ $SECONDS -ge $deadline ] || ! kill -0 "$pid" 2>/dev/null; then break; fi
        sleep 2
    done
    line=$(grep -m1 -E "^ +curl -s -X POST .*/v1/messages/send" "$log" | sed 's/^ *//')
    if [ -z "$line" ]; then
        say "make run printed no curl line (see $log)" | tee -a "$log"
    else
        answer=$(in_root "$root" "$line -w '\n%{http_code}'" 2>>"$log")
        code=$(tail -n1 <<<"$answer")
        id=$(head -n1 <<<"$answer" | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p')
        say "the printed send answered $code: $(head -n1 <<<"$answer" | cut -c1-200)" | tee -a "$log"
        key=$(sed -n "s/.*Authorization: Bearer \([^']*\)'.*/\1/p" <<<"$line")
        for _ in $(seq 1 60); do
            [ "$code" = 202 ] && [ -n "$id" ] || break
            status=$(curl -s -m 3 -H "Authorization: Bearer $key" "http://127.0.0.1:$port/v1/messages/$id" |
                sed -n 's/.*"status": *"\([A-Z_]*\)".*/\1/p')
            case "$status" in SENT | DELIVERED | READ) rc=0; break ;; esac
            sleep 1
        done
        say "message $id: status ${status:-unknown}" | tee -a "$log"
    fi
    kill -INT -- "-$pid" 2>/dev/null
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    RUN_ENV=()
    in_root "$root" "cd /srv/pilot-status && make stop" >>"$log" 2>&1
    return $rc
}

check_suite() {
    local suite=$1 root="$FRESH_DIR/$suite" t0 t_root t_test t_run rc_test rc_run python commit
    local log_root="$FRESH_DIR/$suite.debootstrap.log" log_test="$FRESH_DIR/$suite.test.log" log_run="$FRESH_DIR/$suite.run.log"
    mkdir -p "$FRESH_DIR/debs-$suite"
    unmount_all "$root"
    rm -rf "$root"
    : >"$log_test"
    : >"$log_run"
    t0=$SECONDS
    say "$suite: debootstrap --variant=minbase from $mirror into $root"
    # The .deb cache only saves downloads: every root is unpacked and configured anew.
    debootstrap --variant=minbase --cache-dir="$FRESH_DIR/debs-$suite" "$suite" "$root" "$mirror" >"$log_root" 2>&1 ||
        { say "$suite: debootstrap failed, see $log_root"; return 1; }
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null
    mount_all "$root"
    RUN_ENV=()
    in_root "$root" "apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $BASE_TOOLS && update-ca-certificates" \
        >>"$log_root" 2>&1 || { say "$suite: the base tools did not install, see $log_root"; unmount_all "$root"; return 1; }
    git clone -q "$CHECKOUT" "$root/srv/pilot-status" || { unmount_all "$root"; return 1; }
    commit=$(git -C "$root/srv/pilot-status" rev-parse --short HEAD)
    python=$(in_root "$root" "python3 -V" 2>&1)
    t_root=$((SECONDS - t0))

    say "$suite ($python): make test ${FRESH_TEST_ARGS:-} (log $log_test)"
    t0=$SECONDS
    in_root "$root" "cd /srv/pilot-status && git log -1 --format='commit %h %s' && make test ARGS='${FRESH_TEST_ARGS:-}'" \
        </dev/null >>"$log_test" 2>&1
    rc_test=$?
    t_test=$((SECONDS - t0))
    in_root "$root" "cd /srv/pilot-status && make stop" >>"$log_test" 2>&1

    say "$suite: make run until the API answers (log $log_run)"
    t0=$SECONDS
    run_until_answered "$root" "$log_run"
    rc_run=$?
    t_run=$((SECONDS - t0))
    kill_leftovers "$root" >>"$log_run" 2>&1
    unmount_all "$root"
    [ "${FRESH_KEEP:-0}" = 1 ] || rm -rf "$root"

    local summary
    summary=$(grep -E '^(=+ )?[0-9]+ (passed|failed|errors?)\b.* in [0-9.]+s' "$log_test" | tail -n1 | tr -d '=' | sed 's/^ *//;s/ *$//')
    line="$suite ($python, commit $commit): root ${t_root} s; make test exit $rc_test in ${t_test} s (${summary:-no pytest summary}); make run exit $rc_run, answered in ${t_run} s"
    say "$line"
    printf '%s  %s\n' "$(date -u +%FT%TZ)" "$line" >>"$FRESH_DIR/results.txt"
    [ "$rc_test" = 0 ] && [ "$rc_run" = 0 ]
}

mkdir -p "$FRESH_DIR"
status=0
for suite in "${SUITES[@]}"; do
    check_suite "$suite" || status=1
done
exit $status
