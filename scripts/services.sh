#!/usr/bin/env bash
# Postgres, Redis and RabbitMQ for Pilot Status: private instances on loopback, state in .state/.
# Postgres is the distribution's (15 on Debian 12, 16 on Ubuntu 24.04, 17 on Debian 13): see pg_choose_bin.
#
#   scripts/services.sh up | down | status | destroy
#   scripts/services.sh start   postgres|redis|rabbitmq     (same data, same port as `up`)
#   scripts/services.sh stop    postgres|redis|rabbitmq
#   scripts/services.sh restart postgres|redis|rabbitmq
#   scripts/services.sh install                           (apt packages the servers need)
#   scripts/services.sh apt-ensure PKG...                 (apt-get install PKG... when missing)
#   scripts/services.sh rabbitmqctl ARGS...               (rabbitmqctl for our node; a bare
#                                                          rabbitmqctl would start an epmd on 4369)
#
# Ports (loopback only; scripts/env.sh builds the default URLs from the same numbers). A second
# clone on the same machine gets them shifted by 100, 200, ... (see choose_ports):
#   Postgres 55432 (role pilot/pilot, db pilot_status, CREATEDB for test_pilot_status)
#   Redis    56379 (db 0 for `make run`, db 1 for `make test`)
#   RabbitMQ 56720 (AMQP; vhosts / and evolution for `make run`, pilot_test for `make test`, user guest)
#            56721 (Erlang distribution), epmd 56722 (our own epmd, not the default 4369)
#
# Environment: PG_FAST=1 makes Postgres use synchronous_commit=off (the last few hundred ms of
# commits may be lost on a crash, never corruption; fsync stays on). `make test` sets it; any
# `up`/`start postgres` without it puts synchronous_commit back to its default (on).
# SERVER_NICE (-10; 0 leaves them as started): the servers' CPU priority, see server_priority.
# Every start also takes the servers' ports out of the kernel's ephemeral range (reserve_ports).
#
# Everything is stopped by the PID in its pidfile, never by process name.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
STATE="$ROOT/.state"
# Fallback for state the postgres/rabbitmq users cannot reach inside the repo (a clone under
# /root, as in CI): one folder per repo path, so two clones never share data.
ALT_BASE="/var/tmp/pilot-status-$(printf '%s' "$ROOT" | sha1sum | cut -c1-10)"

PG_BIN=""  # pg_choose_bin
PG_APP_USER=pilot
PG_APP_PASSWORD=pilot
PG_APP_DB=pilot_status
PG_MAX_CONNECTIONS=200

RMQ_NODENAME=rabbit@localhost
RMQ_VHOSTS=(/ pilot_test evolution)

SERVICES=(postgres redis rabbitmq)

# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------
say() { printf '%s\n' "$*"; }

# server_priority NAME PID: the server (every thread of its process group) and its session's autogroup at
# SERVER_NICE. Every hop of an OTP goes through these servers, and on a host they share with the stack they
# serve before any process of ours, as they would on machines of their own (compose: their cpu_shares).
# On a shared host this shortens an OTP's wait behind a marketing backlog (bench/findings.md, "Process
# priorities"). Postgres
# starts each backend in a session of its own: they inherit the postmaster's nice, but where the kernel's
# autogroups are on their sessions stay at nice 0 (what counts there is RabbitMQ's and Redis's). Raising a
# priority takes root: without it the server runs as started, and the status line says so.
server_priority() {
    local nice=${SERVER_NICE:--10} pid=$2 pgid
    SERVER_PRIORITY=""
    [ "$nice" = 0 ] || [ -z "$pid" ] && return 0
    # The process group is field 5 of /proc/PID/stat (after the command's closing parenthesis); no `ps`,
    # which a minimal root does not have.
    pgid=$(sed -n 's/.*) [A-Za-z] [0-9]* \([0-9]*\) .*/\1/p' "/proc/$pid/stat" 2>/dev/null || true)
    if [ -n "$pgid" ] && renice -n "$nice" -g "$pgid" >/dev/null 2>&1; then
        # The session's autogroup weighs more than a process's nice where autogroups are on.
        if grep -q . "/proc/$pid/autogroup" 2>/dev/null; then
            { echo "$nice" >"/proc/$pid/autogroup"; } 2>/dev/null || true
        fi
        SERVER_PRIORITY="  nice $nice"
    else
        SERVER_PRIORITY="  priority as started (SERVER_NICE=$nice takes root)"
    fi
}
die() { printf 'services.sh: %s\n' "$*" >&2; exit 1; }
now_ms() { date +%s%3N; }
since() { # since START_MS -> "1.2s"
    local ms=$(($(now_ms) - $1))
    printf '%d.%ds' $((ms / 1000)) $(((ms % 1000) / 100))
}

# First line of a pidfile, digits only ("" when the file is missing).
read_pid() { [ -r "$1" ] && head -n1 "$1" 2>/dev/null | tr -dc '0-9' || true; }

# pid_is PID COMM: PID runs and is the program we expect. Checking the name protects us from a
# stale pidfile whose number now belongs to some unrelated process (after a crash or reboot).
# Zombies do not count: in containers whose PID 1 does not reap orphans, a stopped daemon stays
# in /proc as a zombie under its old name.
pid_is() {
    local stat comm state
    [ -n "$1" ] && stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    comm=${stat#*(} && comm=${comm%)*} # between the first "(" and the last ")"
    state=${stat##*) } && state=${state%% *}
    [ "$comm" = "$2" ] && [ "$state" != Z ] && [ "$state" != X ]
}

# port_listening PORT: something listens on TCP PORT. Read from /proc instead of connecting:
# a probe connection shows up as an error in the RabbitMQ log, and `ss` may not be installed.
port_listening() {
    local hex
    hex=$(printf ':%04X' "$1")
    awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 }
                     END { exit !found }' /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# port_free_or_die PORT SERVICE: refuse to start when a process we did not start holds the port.
port_free_or_die() {
    if port_listening "$1"; then
        die "$2: port $1 is already in use by a process this script did not start (another clone's services? try its 'scripts/services.sh down'); not touching it"
    fi
}

# wait_until SECONDS CMD...: poll CMD every 0.1 s.
wait_until() {
    local deadline=$(($(now_ms) + $1 * 1000))
    shift
    until "$@"; do
        [ "$(now_ms)" -lt "$deadline" ] || return 1
        sleep 0.1
    done
}

# stop_pid PID COMM SIGNAL TIMEOUT: signal PID, wait for it to exit, SIGKILL after TIMEOUT s.
stop_pid() {
    local pid=$1 comm=$2 sig=$3 timeout=$4
    pid_is "$pid" "$comm" || return 0
    kill "-$sig" "$pid" 2>/dev/null || true
    if ! wait_until "$timeout" eval "! pid_is $pid $comm"; then
        say "  $comm (pid $pid) still running after ${timeout}s: sending SIGKILL" >&2
        kill -KILL "$pid" 2>/dev/null || true
        wait_until 5 eval "! pid_is $pid $comm" || true
    fi
}

# user_can_enter USER DIR: USER can traverse every folder down to DIR.
user_can_enter() { runuser -u "$1" -- test -x "$2" 2>/dev/null; }

# service_dir NAME USER: the folder holding NAME's state, owned by USER. It is .state/NAME when
# USER can get there; otherwise (repo under /root) $ALT_BASE/NAME, linked from .state/NAME so it
# is still found from the repo. The choice is remembered by what exists in .state/.
service_dir() {
    local name=$1 user=$2 dir="$STATE/$1"
    if [ -L "$dir" ]; then
        readlink "$dir"
    elif [ -d "$dir" ]; then
        printf '%s\n' "$dir"
    elif [ -d "$STATE" ] && user_can_enter "$user" "$STATE" && [ ${#dir} -le 70 ]; then
        # (the length limit keeps Postgres' socket path "$dir/data/.s.PGSQL.55432" under the
        # 107-byte limit of Unix socket names)
        printf '%s\n' "$dir"
    else
        printf '%s\n' "$ALT_BASE/$name"
    fi
}

# prepare_dir NAME USER DIR: create DIR for USER (mode 700) and the .state/NAME link if needed.
prepare_dir() {
    local name=$1 user=$2 dir=$3
    if [ "$dir" != "$STATE/$name" ]; then
        install -d -o root -g root -m 755 "$ALT_BASE"
        [ -e "$STATE/$name" ] || ln -s "$dir" "$STATE/$name"
    fi
    install -d -o "$user" -g "$user" -m 700 "$dir"
}

# ---------------------------------------------------------------------------------------------
# packages
# ---------------------------------------------------------------------------------------------
pkg_installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'; }

# apt_install PKG...: install, running `apt-get update` only when there are no package lists
# yet (fresh machine/image) or when the install fails on stale lists.
apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    local t0
    t0=$(now_ms)
    say "apt: installing $*"
    if ! compgen -G '/var/lib/apt/lists/*_Packages' >/dev/null; then
        apt-get update -q
    fi
    if ! apt-get install -y -q "$@" </dev/null; then
        apt-get update -q
        apt-get install -y -q "$@" </dev/null
    fi
    say "apt: installed $* in $(since "$t0")"
}

apt_ensure() {
    local pkg missing=()
    for pkg in "$@"; do pkg_installed "$pkg" || missing+=("$pkg"); done
    [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
}

# pg_choose_bin: PG_BIN, the binaries of the Postgres this clone's cluster was made with (its PG_VERSION;
# a cluster never starts under another major version), else the newest installed (Debian's `postgresql`
# package brings the distribution's own: 15 on Debian 12, 17 on Debian 13). Empty when none is installed.
pg_choose_bin() {
    local version="" dir
    pg_paths
    [ -r "$PG_DATA/PG_VERSION" ] && version=$(tr -dc '0-9' <"$PG_DATA/PG_VERSION")
    if [ -n "$version" ]; then
        PG_BIN=/usr/lib/postgresql/$version/bin
        return 0
    fi
    PG_BIN=""
    for dir in $(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V); do
        [ -x "$dir/postgres" ] && [ -x "$dir/psql" ] && PG_BIN=$dir
    done
    return 0
}

# The servers' packages, checked by their binaries (fast, no apt call when all are there).
ensure_packages() {
    local missing=() version=""
    pg_choose_bin
    [ -x /usr/bin/redis-server ] || missing+=(redis-server)
    [ -x /usr/sbin/rabbitmq-server ] || missing+=(rabbitmq-server)
    if [ -z "$PG_BIN" ] || [ ! -x "$PG_BIN/postgres" ] || [ ! -x "$PG_BIN/psql" ]; then
        version=${PG_BIN#/usr/lib/postgresql/}
        version=${version%/bin}
        # the cluster's own major version, else the distribution's default
        if [ -n "$version" ]; then missing+=("postgresql-$version"); else missing+=(postgresql); fi
    fi
    [ ${#missing[@]} -eq 0 ] || apt_install "${missing[@]}"
    pg_choose_bin
}

# ---------------------------------------------------------------------------------------------
# Postgres: a throwaway cluster run by user postgres (it refuses to run as root)
# ---------------------------------------------------------------------------------------------
pg_paths() {
    PG_DIR=$(service_dir pg postgres)
    PG_DATA="$PG_DIR/data"
    PG_LOG="$PG_DIR/postgres.log"
}
pg_pid() { read_pid "$PG_DATA/postmaster.pid"; } # line 1 of postmaster.pid is the postmaster
pg_alive() { pid_is "$(pg_pid)" postgres; }
pg_running() { pg_alive && port_listening "$PG_PORT"; }

# as_postgres CMD...: run as postgres from a folder it can enter (runuser keeps our cwd, which
# may be under /root), in its own session so a Ctrl-C in the calling terminal never reaches the
# server.
as_postgres() { (cd "$PG_DIR" && setsid -w runuser -u postgres -- "$@"); }

psql_admin() { # SQL on stdin
    "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres
}

# Role and database for the app (idempotent), and the PG_FAST durability switch.
pg_configure() {
    local sync_commit="ALTER SYSTEM RESET synchronous_commit;"
    [ "${PG_FAST:-0}" = 1 ] && sync_commit="ALTER SYSTEM SET synchronous_commit = off;"
    psql_admin <<SQL
DO \$\$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '$PG_APP_USER') THEN
        CREATE ROLE $PG_APP_USER;
    END IF;
END \$\$;
-- CREATEDB: pytest-django creates and drops test_$PG_APP_DB.
ALTER ROLE $PG_APP_USER LOGIN CREATEDB PASSWORD '$PG_APP_PASSWORD';
SELECT 'CREATE DATABASE $PG_APP_DB OWNER $PG_APP_USER'
 WHERE NOT EXISTS (SELECT FROM pg_database WHERE datname = '$PG_APP_DB') \gexec
$sync_commit
SELECT pg_reload_conf() \g /dev/null
SQL
}

# Our settings live in pilot_status.conf, included from postgresql.conf (later lines win) and
# rewritten on every start, so a plain `pg_ctl start` on the folder behaves the same.
pg_write_config() {
    cat >"$PG_DATA/pilot_status.conf" <<CONF
# Generated by scripts/services.sh on every start; edit the script, not this file.
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_DATA'   # keeps the socket out of /var/run/postgresql
max_connections = $PG_MAX_CONNECTIONS
CONF
    chown postgres:postgres "$PG_DATA/pilot_status.conf"
    grep -qxF "include_if_exists = 'pilot_status.conf'" "$PG_DATA/postgresql.conf" ||
        printf "\ninclude_if_exists = 'pilot_status.conf'\n" >>"$PG_DATA/postgresql.conf"
}

# pg_processes_gone: no live process has the data folder as its working directory (Postgres
# children keep running for a moment after their postmaster was killed).
pg_processes_gone() {
    local d
    for d in /proc/[0-9]*; do
        [ "$(readlink "$d/cwd" 2>/dev/null)" = "$PG_DATA" ] && return 1
    done
    return 0
}

# After a crash postmaster.pid (and the socket's .lock) remain. Postgres refuses to start while
# the PID they name exists, and a killed postmaster can linger as a zombie (PID 1 here reaps
# orphans lazily): once the old processes are gone, the lock files are stale and we remove them.
pg_clear_stale_lock() {
    local sock="$PG_DATA/.s.PGSQL.$PG_PORT"
    [ -e "$PG_DATA/postmaster.pid" ] || [ -e "$sock.lock" ] || return 0
    pid_is "$(pg_pid)" postgres && return 0
    wait_until 15 pg_processes_gone || die "postgres: old server processes still use $PG_DATA"
    rm -f "$PG_DATA/postmaster.pid" "$sock" "$sock.lock"
}

pg_start() {
    local t0 how=running
    t0=$(now_ms)
    pg_paths
    # Alive but not listening yet: another call is starting it (or it is recovering); wait.
    if pg_alive && ! wait_until 60 port_listening "$PG_PORT"; then
        die "postgres: pid $(pg_pid) runs but 127.0.0.1:$PG_PORT stays closed; see $PG_LOG"
    fi
    if ! pg_running; then
        port_free_or_die "$PG_PORT" postgres
        prepare_dir pg postgres "$PG_DIR"
        if [ ! -s "$PG_DATA/PG_VERSION" ]; then
            # No finished cluster: start from scratch (also cleans up an interrupted initdb).
            rm -rf "$PG_DATA"
            as_postgres "$PG_BIN/initdb" -D "$PG_DATA" -U postgres --auth=trust -E UTF8 \
                --locale=C.UTF-8 >"$PG_DIR/initdb.log" 2>&1 ||
                die "postgres: initdb failed, see $PG_DIR/initdb.log"
        fi
        # trust auth is fine: the cluster only listens on 127.0.0.1 and its socket lives in the
        # data folder, which only postgres can enter.
        pg_write_config
        pg_clear_stale_lock
        as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t 60 start >/dev/null ||
            { tail -n 20 "$PG_LOG" >&2; die "postgres: failed to start, see $PG_LOG"; }
        how=started
    fi
    pg_configure
    local mode="synchronous_commit=on"
    [ "${PG_FAST:-0}" = 1 ] && mode="synchronous_commit=off (PG_FAST=1)"
    server_priority postgres "$(pg_pid)"
    say "postgres  $how  127.0.0.1:$PG_PORT  pid $(pg_pid)  db $PG_APP_DB, $mode$SERVER_PRIORITY  ($(since "$t0"))"
}

pg_stop() {
    pg_paths
    local pid
    pid=$(pg_pid)
    if pid_is "$pid" postgres; then
        # pg_ctl stops the PID recorded in postmaster.pid; "fast" rolls back open transactions.
        as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t 60 stop >/dev/null ||
            stop_pid "$pid" postgres INT 30
        say "postgres  stopped (pid $pid)"
    else
        say "postgres  not running"
    fi
}

pg_status() {
    pg_paths
    if pg_alive && ! pg_running; then
        say "postgres  starting  pid $(pg_pid), 127.0.0.1:$PG_PORT not open yet"
        return 1
    elif pg_running; then
        say "postgres  up    127.0.0.1:$PG_PORT  pid $(pg_pid)  data $PG_DATA"
    else
        say "postgres  down  127.0.0.1:$PG_PORT  data $PG_DATA"
        return 1
    fi
}

# ---------------------------------------------------------------------------------------------
# Redis: runs as root, no persistence (it is a cache and a metrics store for dev and tests)
# ---------------------------------------------------------------------------------------------
REDIS_DIR="$STATE/redis"
REDIS_PIDFILE="$REDIS_DIR/redis.pid"
redis_pid() { read_pid "$REDIS_PIDFILE"; }
redis_alive() { pid_is "$(redis_pid)" redis-server; }
redis_running() { redis_alive && port_listening "$REDIS_PORT"; }

redis_start() {
    local t0 how=running
    t0=$(now_ms)
    if redis_alive && ! wait_until 10 port_listening "$REDIS_PORT"; then
        die "redis: pid $(redis_pid) runs but 127.0.0.1:$REDIS_PORT stays closed"
    fi
    if ! redis_running; then
        port_free_or_die "$REDIS_PORT" redis
        mkdir -p "$REDIS_DIR"
        rm -f "$REDIS_PIDFILE"
        redis-server --port "$REDIS_PORT" --bind 127.0.0.1 --protected-mode yes \
            --daemonize yes --dir "$REDIS_DIR" --pidfile "$REDIS_PIDFILE" \
            --logfile "$REDIS_DIR/redis.log" --save '' --appendonly no
        wait_until 10 redis_running ||
            { tail -n 20 "$REDIS_DIR/redis.log" >&2; die "redis: failed to start"; }
        how=started
    fi
    server_priority redis "$(redis_pid)"
    say "redis     $how  127.0.0.1:$REDIS_PORT  pid $(redis_pid)$SERVER_PRIORITY  ($(since "$t0"))"
}

redis_stop() {
    local pid
    pid=$(redis_pid)
    if pid_is "$pid" redis-server; then
        stop_pid "$pid" redis-server TERM 20
        say "redis     stopped (pid $pid)"
    else
        say "redis     not running"
    fi
    rm -f "$REDIS_PIDFILE"
}

redis_status() {
    if redis_alive && ! redis_running; then
        say "redis     starting  pid $(redis_pid), 127.0.0.1:$REDIS_PORT not open yet"
        return 1
    elif redis_running; then
        say "redis     up    127.0.0.1:$REDIS_PORT  pid $(redis_pid)  (db 0: make run, db 1: make test)"
    else
        say "redis     down  127.0.0.1:$REDIS_PORT"
        return 1
    fi
}

# ---------------------------------------------------------------------------------------------
# RabbitMQ: through the /usr/sbin wrappers, which switch to user rabbitmq (and so use its Erlang
# cookie, the one rabbitmqctl also uses). All state lives in $RMQ_DIR, owned by rabbitmq.
# ---------------------------------------------------------------------------------------------
rmq_paths() {
    RMQ_DIR=$(service_dir rabbitmq rabbitmq)
    RMQ_PIDFILE="$RMQ_DIR/rabbitmq.pid"
    EPMD_PIDFILE="$RMQ_DIR/epmd.pid"
}

# Every rabbitmq-server/rabbitmqctl call needs exactly this environment (the wrappers keep it
# across their `su rabbitmq`). ERL_EPMD_PORT points at our epmd: without it rabbitmqctl would
# look for (and start!) an epmd on 4369.
rmq_env() {
    export RABBITMQ_NODENAME=$RMQ_NODENAME # "localhost" resolves everywhere; the hostname may not
    export RABBITMQ_CONF_ENV_FILE="$RMQ_DIR/rabbitmq-env.conf" # ignore /etc/rabbitmq's
    export RABBITMQ_CONFIG_FILE="$RMQ_DIR/rabbitmq.conf"
    export RABBITMQ_ADVANCED_CONFIG_FILE="$RMQ_DIR/advanced.config"
    export RABBITMQ_ENABLED_PLUGINS_FILE="$RMQ_DIR/enabled_plugins"
    export RABBITMQ_MNESIA_BASE="$RMQ_DIR/mnesia"
    export RABBITMQ_LOG_BASE="$RMQ_DIR/log"
    export RABBITMQ_PID_FILE="$RMQ_PIDFILE"
    export RABBITMQ_DIST_PORT=$RMQ_DIST_PORT
    export ERL_EPMD_ADDRESS=127.0.0.1
    export ERL_EPMD_PORT=$EPMD_PORT
    # Without this the distribution port listens on all interfaces.
    export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
}

rmqctl() { (rmq_env && /usr/sbin/rabbitmqctl "$@" </dev/null); }

rmq_pid() { read_pid "$RMQ_PIDFILE"; }
rmq_alive() { pid_is "$(rmq_pid)" beam.smp; }
rmq_running() { rmq_alive && port_listening "$AMQP_PORT"; }
epmd_pid() { read_pid "$EPMD_PIDFILE"; }
epmd_running() { pid_is "$(epmd_pid)" epmd && port_listening "$EPMD_PORT"; }

# Config files are rewritten on every start so that they always match this script.
rmq_write_config() {
    : >"$RMQ_DIR/rabbitmq-env.conf"
    printf '[].\n' >"$RMQ_DIR/enabled_plugins" # no plugins: management adds ~1 s up, ~5 s down
    printf '[].\n' >"$RMQ_DIR/advanced.config"
    cat >"$RMQ_DIR/rabbitmq.conf" <<CONF
# Generated by scripts/services.sh on every start; edit the script, not this file.
listeners.tcp.default = 127.0.0.1:$AMQP_PORT
# guest may only log in from loopback (RabbitMQ's default), which is all we use.
loopback_users.guest = true
log.file.level = info
log.console = false
CONF
    mkdir -p "$RMQ_DIR/mnesia" "$RMQ_DIR/log"
    chown -R rabbitmq:rabbitmq "$RMQ_DIR"
}

# epmd outlives the broker when the broker starts it, so we start it ourselves (as rabbitmq, on
# loopback and a private port) and keep its PID. The `sh -c 'echo $$; exec'` records the PID of
# epmd itself, whatever setsid/runuser do in between.
epmd_start() {
    epmd_running && return 0
    port_free_or_die "$EPMD_PORT" epmd
    rm -f "$EPMD_PIDFILE"
    local epmd_bin
    epmd_bin=$(command -v epmd) || die "epmd not found (erlang-base missing?)"
    # shellcheck disable=SC2016 # $$, $1.. are for the inner sh
    setsid -f runuser -u rabbitmq -- /bin/sh -c 'echo $$ >"$1"; exec "$2" -address 127.0.0.1 -port "$3"' \
        sh "$EPMD_PIDFILE" "$epmd_bin" "$EPMD_PORT" </dev/null >>"$RMQ_DIR/log/epmd.log" 2>&1
    wait_until 10 epmd_running || die "rabbitmq: epmd did not start on 127.0.0.1:$EPMD_PORT"
}

epmd_stop() {
    local pid
    pid=$(epmd_pid)
    if pid_is "$pid" epmd; then
        stop_pid "$pid" epmd TERM 10
        say "epmd      stopped (pid $pid)"
    fi
    rm -f "$EPMD_PIDFILE"
}

# rmq_launch: start the broker without waiting for it (it is the slow one: we start Postgres and
# Redis meanwhile). Sets RMQ_LAUNCHED=1 when it had to start it.
RMQ_LAUNCHED=0
rmq_launch() {
    rmq_paths
    RMQ_T0=$(now_ms)
    RMQ_LAUNCHED=0
    rmq_running && return 0
    if rmq_alive; then # still booting (another call launched it): just wait for it
        RMQ_LAUNCHED=1
        return 0
    fi
    port_free_or_die "$AMQP_PORT" rabbitmq
    port_free_or_die "$RMQ_DIST_PORT" "rabbitmq (distribution port)"
    prepare_dir rabbitmq rabbitmq "$RMQ_DIR"
    rmq_write_config
    epmd_start
    rm -f "$RMQ_PIDFILE" # stale after a crash
    # Foreground mode in the background (not -detached) so that early errors land in
    # startup.log; setsid -f puts it in its own session, out of reach of the caller's Ctrl-C.
    (rmq_env && setsid -f /usr/sbin/rabbitmq-server </dev/null >>"$RMQ_DIR/startup.log" 2>&1)
    RMQ_LAUNCHED=1
}

# rmq_ready: wait for a launched broker, then make sure the vhosts and permissions exist.
rmq_ready() {
    local how=running
    if [ "$RMQ_LAUNCHED" = 1 ]; then
        # `await_startup` right after launch exits 69 (node not there yet): poll the port first.
        if ! wait_until 90 port_listening "$AMQP_PORT"; then
            tail -n 20 "$RMQ_DIR/startup.log" >&2 || true
            die "rabbitmq: AMQP port $AMQP_PORT did not open within 90 s; logs in $RMQ_DIR/log"
        fi
        rmqctl -q await_startup >/dev/null || die "rabbitmq: await_startup failed; logs in $RMQ_DIR/log"
        how=started
    fi
    rmq_ensure_vhosts
    server_priority rabbitmq "$(rmq_pid)"
    say "rabbitmq  $how  127.0.0.1:$AMQP_PORT  pid $(rmq_pid)  vhosts ${RMQ_VHOSTS[*]}$SERVER_PRIORITY  ($(since "$RMQ_T0"))"
}

# Vhost pilot_test keeps the test suite's tasks away from a running `make run` (vhost /); vhost
# evolution is where `make run`'s Evolution (the simulator) publishes, apart from Celery's tasks.
# One CLI call when all is in place (each call costs a ~0.5 s Erlang VM start).
rmq_ensure_vhosts() {
    local vhosts vhost
    vhosts=$(rmqctl -q list_vhosts --no-table-headers) || die "rabbitmq: list_vhosts failed"
    for vhost in "${RMQ_VHOSTS[@]}"; do
        if ! grep -qxF -- "$vhost" <<<"$vhosts"; then
            rmqctl -q add_vhost "$vhost" >/dev/null
            rmqctl -q set_permissions -p "$vhost" guest '.*' '.*' '.*' >/dev/null
        fi
    done
}

rmq_start() {
    rmq_launch
    rmq_ready
}

rmq_stop() {
    rmq_paths
    local pid
    pid=$(rmq_pid)
    if pid_is "$pid" beam.smp; then
        # SIGTERM makes RabbitMQ shut down cleanly (its own signal handler), like `rabbitmqctl
        # stop`, without starting a CLI VM.
        stop_pid "$pid" beam.smp TERM 60
        say "rabbitmq  stopped (pid $pid)"
    else
        say "rabbitmq  not running"
    fi
    rm -f "$RMQ_PIDFILE"
    epmd_stop
}

rmq_status() {
    rmq_paths
    if rmq_alive && ! rmq_running; then
        say "rabbitmq  starting  pid $(rmq_pid), 127.0.0.1:$AMQP_PORT not open yet"
        return 1
    elif rmq_running; then
        say "rabbitmq  up    127.0.0.1:$AMQP_PORT  pid $(rmq_pid)  vhosts ${RMQ_VHOSTS[*]}  dist 127.0.0.1:$RMQ_DIST_PORT  epmd 127.0.0.1:$EPMD_PORT pid $(epmd_pid)  state $RMQ_DIR"
    else
        local epmd=""
        epmd_running && epmd=" (epmd still up, pid $(epmd_pid))"
        say "rabbitmq  down  127.0.0.1:$AMQP_PORT$epmd"
        return 1
    fi
}

# ---------------------------------------------------------------------------------------------
# ports
# ---------------------------------------------------------------------------------------------
# Each clone records its port offset in .state/port-offset (scripts/env.sh reads it too). It is
# 0 (the documented ports) unless those were busy at this clone's first start: then a CI clone
# run next to a developer's running stack on the same machine gets its own ports instead of
# failing or, worse, sharing test databases and queues.
PORT_OFFSET_FILE="$STATE/port-offset"

set_ports() {
    PG_PORT=$((55432 + $1))
    REDIS_PORT=$((56379 + $1))
    AMQP_PORT=$((56720 + $1))
    RMQ_DIST_PORT=$((56721 + $1))
    EPMD_PORT=$((56722 + $1))
}

load_ports() {
    local off=0
    [ -r "$PORT_OFFSET_FILE" ] && off=$(tr -dc '0-9' <"$PORT_OFFSET_FILE")
    set_ports "${off:-0}"
}

# ports_free: no socket holds any of our ports, listening or not: the ports lie in the ephemeral range, and an
# outgoing connection that holds one as its local port keeps a server from listening there (eaddrinuse) as surely
# as another server does. TIME_WAIT (06) does not count: the servers bind over it.
ports_free() {
    local port hex
    for port in "$PG_PORT" "$REDIS_PORT" "$AMQP_PORT" "$RMQ_DIST_PORT" "$EPMD_PORT"; do
        hex=$(printf ':%04X' "$port")
        awk -v p="$hex" '$4 != "06" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' \
            /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 1
    done
    return 0
}

any_of_ours_alive() {
    pg_paths
    rmq_paths
    pg_alive || redis_alive || rmq_alive || pid_is "$(epmd_pid)" epmd
}

# choose_ports: on this clone's first start pick the offset, then stick to it (same data, same
# ports, as the fault tests that stop and start a server expect).
choose_ports() {
    [ -s "$PORT_OFFSET_FILE" ] && return 0
    local off
    if any_of_ours_alive; then # started before offsets were recorded
        off=0
    else
        for off in 0 100 200 300 400 500 600 700 800 900 ""; do
            [ -n "$off" ] || die "no free port set found (tried offsets 0..900 from 55432/56379/56720)"
            set_ports "$off"
            ports_free && break
        done
        [ "$off" = 0 ] ||
            say "note: the default ports are busy (another clone's services?); this clone uses ports +$off"
    fi
    printf '%s\n' "$off" >"$PORT_OFFSET_FILE"
    set_ports "$off"
}

# reserve_ports: take our ports out of the kernel's ephemeral range (ip_local_reserved_ports, kept as it is
# otherwise). They lie inside it (32768-60999 by default): while a server is stopped, an outgoing connection
# may get its port as a local one, most often a client reconnecting to that very server (on loopback a
# connect to 127.0.0.1:P from local port P connects to itself), and the server then cannot listen again.
# `make test` saw RabbitMQ, restarted by a fault test, die with eaddrinuse on 56720.
reserve_ports() {
    local file=/proc/sys/net/ipv4/ip_local_reserved_ports current port item missing=""
    [ -r "$file" ] || return 0
    current=$(tr -d ' \n' <"$file")
    for port in "$PG_PORT" "$REDIS_PORT" "$AMQP_PORT" "$RMQ_DIST_PORT" "$EPMD_PORT"; do
        for item in ${current//,/ }; do
            [ "$port" -ge "${item%-*}" ] && [ "$port" -le "${item#*-}" ] && continue 2
        done
        missing="$missing,$port"
    done
    [ -n "$missing" ] || return 0
    { printf '%s\n' "${current}${missing}" | sed 's/^,//' >"$file"; } 2>/dev/null ||
        say "note: could not reserve ports${missing//,/ } ($file): a stopped server may lose its port"
}

# ---------------------------------------------------------------------------------------------
# commands
# ---------------------------------------------------------------------------------------------
cmd_up() {
    local t0
    t0=$(now_ms)
    ensure_packages
    choose_ports
    reserve_ports
    rmq_launch # slowest first, in the background
    pg_start
    redis_start
    rmq_ready
    say "services up in $(since "$t0")"
}

cmd_down() {
    local t0
    t0=$(now_ms)
    rmq_stop
    redis_stop
    pg_stop
    say "services down in $(since "$t0")"
}

cmd_status() {
    local rc=0
    pg_status || rc=3
    redis_status || rc=3
    rmq_status || rc=3
    return $rc
}

# destroy: stop everything and delete all service data (Postgres cluster, RabbitMQ mnesia).
cmd_destroy() {
    cmd_down
    rm -rf "$STATE/pg" "$STATE/redis" "$STATE/rabbitmq" "$ALT_BASE" "$PORT_OFFSET_FILE"
    say "service data removed"
}

one_service() { # one_service start|stop NAME
    local action=$1 name=$2
    if [ "$action" = start ]; then
        ensure_packages
        choose_ports
        reserve_ports
    fi
    case "$name" in
    postgres | pg) if [ "$action" = start ]; then pg_start; else pg_stop; fi ;;
    redis) if [ "$action" = start ]; then redis_start; else redis_stop; fi ;;
    rabbitmq | rabbit) if [ "$action" = start ]; then rmq_start; else rmq_stop; fi ;;
    *) die "unknown service '$name' (one of: ${SERVICES[*]})" ;;
    esac
}

usage() { sed -n '2,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

main() {
    [ "$(id -u)" = 0 ] || die "must run as root (it uses apt-get and runuser)"
    local cmd=${1:-}
    [ -n "$cmd" ] || usage
    mkdir -p "$STATE"
    load_ports
    pg_choose_bin
    # Serialise state-changing commands (two `make test` at once would otherwise race to start
    # the same servers). flock -o: the lock is not inherited by the servers we start.
    if [ "$cmd" != status ] && [ -z "${PILOT_SERVICES_LOCKED:-}" ]; then
        export PILOT_SERVICES_LOCKED=1
        exec flock -o -w 300 "$STATE/.services.lock" "$BASH" "${BASH_SOURCE[0]}" "$@"
    fi
    case "$cmd" in
    up) cmd_up ;;
    down) cmd_down ;;
    status) cmd_status ;;
    destroy) cmd_destroy ;;
    start | stop) [ $# -eq 2 ] || usage; one_service "$1" "$2" ;;
    restart) [ $# -eq 2 ] || usage; one_service stop "$2"; one_service start "$2" ;;
    install) ensure_packages ;;
    rabbitmqctl | ctl) shift; rmq_paths; rmqctl "$@" ;;
    apt-ensure) shift; [ $# -gt 0 ] || usage; apt_ensure "$@" ;;
    *) usage ;;
    esac
}

main "$@"
