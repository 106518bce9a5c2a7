#!/usr/bin/env bash
# Starts one process of the stack at its CPU priority: the Procfile's launcher (`make run`), which the bench
# and the chaos stack use too. The product never changes its own priority; this is the deployment's job, and in
# production the systemd units in deploy/systemd (Slice=, CPUWeight=) or compose's cpu_shares do it.
#
#   scripts/launch.sh otp|bulk COMMAND [ARG ...]     exec COMMAND (same PID) at the class's priority
#   scripts/launch.sh --describe                     say what this host allows, in one line
#
# otp:  the client API and the OTP path (web, relay_otp, worker_otp), as started.
# bulk: every other process of ours (the bulk lanes, receipts, callbacks, maintenance): at nice BACKGROUND_NICE
#       (default 10; 0: no nice), so that a marketing drain and its receipts never make an OTP
#       wait for a CPU on a host they share.
# - With the kernel's autogroups on, the scheduler shares the CPU between sessions before it looks at a process's
#   nice, and honcho starts every process in a session of its own: a process that leads its session gives the
#   session the same nice (/proc/self/autogroup), or its own nice would count for nothing.
# - Where systemd runs and lets us (root, or a user manager), each process also gets a scope of its own in the
#   class's slice, weighted as deploy/systemd's are: pilot-status-otp.slice (CPUWeight 1000) or
#   pilot-status-bulk.slice (CPUWeight 20).
# - Where there is no systemd but the CPU cgroup is ours to write (a container run as root, a bare root shell), the
#   launcher makes the same tree systemd would: the two slices under the cgroup root, weighted the same, and a group
#   of its own per process inside its slice (a unit's cgroup), so that processes of one class share their slice by
#   process, as units do. Empty groups left by processes that ended are removed at the next launch.
#   LAUNCH_CGROUP_ROOT names another root (tests); LAUNCH_SLICES=0 leaves both systemd and cgroups out.
set -euo pipefail

OTP_WEIGHT=1000
BULK_WEIGHT=20

systemd_run() {
    # Prints the systemd-run flags for a scope on this host, or nothing when there is none to be had.
    [ "${LAUNCH_SLICES:-1}" != 0 ] && command -v systemd-run >/dev/null 2>&1 || return 0
    if [ "$(id -u)" = 0 ] && [ -d /run/systemd/system ]; then
        echo "systemd-run --scope --quiet --collect"
    elif [ -n "${XDG_RUNTIME_DIR:-}" ] && [ -S "$XDG_RUNTIME_DIR/systemd/private" ]; then
        echo "systemd-run --user --scope --quiet --collect"
    fi
}

cgroup_root() {
    # Prints "v2 DIR" or "v1 DIR": a CPU cgroup root this launcher may make slices under; nothing when there is none.
    [ "${LAUNCH_SLICES:-1}" != 0 ] || return 0
    local root
    if [ -n "${LAUNCH_CGROUP_ROOT:-}" ]; then
        root=$LAUNCH_CGROUP_ROOT
        if [ -e "$root/cpu.shares" ]; then echo "v1 $root"; else echo "v2 $root"; fi
        return 0
    fi
    root=/sys/fs/cgroup
    if [ -f "$root/cgroup.subtree_control" ]; then
        # cgroup v2: only where the root already hands the cpu controller down (enabling it is the host's call).
        grep -qw cpu "$root/cgroup.subtree_control" && [ -w "$root" ] && echo "v2 $root"
    elif [ -w "$root/cpu" ] && [ -e "$root/cpu/cpu.shares" ]; then
        echo "v1 $root/cpu"
    fi
    return 0
}

enter_cgroup() {
    # Moves this process (and so the command it execs) into <root>/pilot-status-<class>.slice/run-<pid>.scope.
    local version=$1 root=$2 weight=$3 slice group file value
    slice="$root/pilot-status-$class.slice"
    group="$slice/run-$$.scope"
    if [ "$version" = v1 ]; then
        file=cpu.shares value=$((weight * 1024 / 100))  # systemd's mapping of CPUWeight onto cpu.shares
    else
        file=cpu.weight value=$weight
    fi
    for old in "$slice"/run-*.scope; do
        [ -d "$old" ] && rmdir "$old" 2>/dev/null || true
    done
    if mkdir -p "$group" 2>/dev/null && { echo "$value" >"$slice/$file"; } 2>/dev/null \
            && { [ "$version" = v1 ] || { echo +cpu >"$slice/cgroup.subtree_control"; } 2>/dev/null; } \
            && { echo $$ >"$group/cgroup.procs"; } 2>/dev/null; then
        return 0
    fi
    rmdir "$group" 2>/dev/null || true
    echo "scripts/launch.sh: no cgroup of its class for this process ($group refused it)" >&2
}

session_nice() {
    # The session's nice, when this process leads its session and the kernel groups by session.
    local nice=$1 stat
    [ -r /proc/self/autogroup ] && [ -n "$(cat /proc/self/autogroup 2>/dev/null)" ] || return 0
    stat=$(cat /proc/$$/stat)
    stat=${stat##*) }
    read -r _ _ _ session _ <<<"$stat"
    [ "$session" = $$ ] || return 0
    # An unprivileged user may change an autogroup once per 100 ms (EAGAIN), and honcho starts all at once.
    for _ in $(seq 50); do
        if { echo "$nice" >/proc/self/autogroup; } 2>/dev/null; then return 0; fi
        sleep 0.1
    done
    echo "scripts/launch.sh: the session's priority stays as it is (/proc/self/autogroup refused $nice)" >&2
}

case "${1:-}" in
    --describe)
        scope=$(systemd_run)
        cgroups=$(cgroup_root)
        if [ -n "$scope" ]; then
            slices="systemd scopes in pilot-status-otp.slice / pilot-status-bulk.slice"
        elif [ -n "$cgroups" ]; then
            slices="no systemd; cgroup ${cgroups%% *} slices pilot-status-otp.slice / pilot-status-bulk.slice under ${cgroups#* }"
        else
            slices="no systemd slices on this host"
        fi
        echo "bulk at nice ${BACKGROUND_NICE:-10} (the session's too where the kernel groups by session); $slices"
        exit 0 ;;
    otp) weight=$OTP_WEIGHT; nice=0 ;;
    bulk) weight=$BULK_WEIGHT; nice=${BACKGROUND_NICE:-10} ;;
    *) echo "usage: scripts/launch.sh otp|bulk COMMAND [ARG ...] | --describe" >&2; exit 2 ;;
esac
class=$1
shift
[ $# -gt 0 ] || { echo "usage: scripts/launch.sh otp|bulk COMMAND [ARG ...]" >&2; exit 2; }
case "$nice" in
    ''|*[!0-9-]*) echo "scripts/launch.sh: BACKGROUND_NICE must be a number (-20..19), got '$nice'" >&2; exit 2 ;;
esac

prefix=()
if [ "$nice" != 0 ]; then
    session_nice "$nice"
    prefix=(nice -n "$nice")
fi
scope=$(systemd_run)
if [ -n "$scope" ]; then
    # shellcheck disable=SC2206
    prefix=($scope "--slice=pilot-status-$class.slice" -p "CPUWeight=$weight" -- "${prefix[@]}")
else
    cgroups=$(cgroup_root)
    # shellcheck disable=SC2086
    [ -z "$cgroups" ] || enter_cgroup $cgroups "$weight"
fi
exec "${prefix[@]}" "$@"
