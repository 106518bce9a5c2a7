#!/usr/bin/env bash
# The project's environment (README, "Set-up"; .env.example), for make recipes and for your own shell.
#
#   scripts/env.sh [--test] COMMAND [ARGS...]   run COMMAND in that environment
#   scripts/env.sh [--test]                      print the resulting §7 variables
#   source scripts/env.sh [--test]               load it into the current bash shell
#
# Precedence, variable by variable: a non-empty value already in the environment wins (so
# `EVOLUTION_API_URL=https://evo.example make run` works), then .env, then the defaults below.
#
# --test (used by `make test`): Redis db 1 and the RabbitMQ vhost pilot_test instead of db 0 and
# vhost /, so that a running `make run` never consumes the tests' tasks; and .env is NOT read, so
# that tests behave as in CI and never reach a real Evolution API or database named in .env.
# The environment still wins.
#
# Default ports come from scripts/services.sh; a clone whose services had to use shifted ports
# (.state/port-offset, see services.sh) gets its URLs shifted the same way.

_pilot_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"

# _pilot_default NAME VALUE: set NAME unless it already has a non-empty value; export it either
# way (when this file is sourced, NAME may be a plain shell variable).
_pilot_default() {
    if [ -z "${!1:-}" ]; then
        export "$1=$2"
    else
        export "${1?}"
    fi
}

# _pilot_load_dotenv FILE: KEY=VALUE lines (optional `export `, '#' comments, optional single or
# double quotes, no variable interpolation). Never overrides a non-empty environment value.
_pilot_load_dotenv() {
    local file=$1 line key value n=0
    [ -f "$file" ] || return 0
    while IFS= read -r line || [ -n "$line" ]; do
        n=$((n + 1))
        line=${line%$'\r'}
        line=${line#"${line%%[![:space:]]*}"} # leading blanks
        case $line in '' | '#'*) continue ;; esac
        line=${line#export }
        if [[ $line =~ ^([A-Za-z_][A-Za-z0-9_]*)[[:space:]]*=[[:space:]]*(.*)$ ]]; then
            key=${BASH_REMATCH[1]}
            value=${BASH_REMATCH[2]}
            case $value in
            \"*\" | \'*\') value=${value:1:${#value}-2} ;;
            *)
                value=${value%%[[:space:]]#*}           # " # comment" after an unquoted value
                value=${value%"${value##*[![:space:]]}"} # trailing blanks
                ;;
            esac
            _pilot_default "$key" "$value"
        else
            printf 'env.sh: %s line %d ignored (not KEY=VALUE)\n' "$file" "$n" >&2
        fi
    done <"$file"
}

# _pilot_random: 64 URL-safe random characters (48 bytes).
_pilot_random() {
    head -c 48 /dev/urandom | base64 | tr -d '\n' | tr '+/' '-_'
}

# _pilot_dev_secrets: SECRET_KEY, INTERNAL_WEBHOOK_SECRET and METRICS_TOKEN of this clone, drawn at
# random on first use and kept in .state/dev-secrets (git-ignored, mode 600). No secret is written in
# the repository: production mode refuses every value that ever was (pilot_status/production.py).
_pilot_dev_secrets() {
    local file="$_pilot_root/.state/dev-secrets" tmp
    if [ ! -e "$file" ]; then
        mkdir -p "$_pilot_root/.state"
        tmp=$(umask 077 && mktemp "$file.XXXXXX") || return 1
        printf 'SECRET_KEY=%s\nINTERNAL_WEBHOOK_SECRET=%s\nMETRICS_TOKEN=%s\n' \
            "$(_pilot_random)" "$(_pilot_random)" "$(_pilot_random)" >"$tmp"
        # Two first uses at once: ln fails for the second, and both read the first one's file.
        ln "$tmp" "$file" 2>/dev/null || true
        rm -f "$tmp"
    fi
    # A clone whose file predates METRICS_TOKEN (issue 24) gets one added.
    grep -q '^METRICS_TOKEN=' "$file" || printf 'METRICS_TOKEN=%s\n' "$(_pilot_random)" >>"$file"
    _pilot_load_dotenv "$file"
}

_pilot_env() {
    local test_mode=0 off=0
    [ "${1:-}" = --test ] && test_mode=1
    [ -r "$_pilot_root/.state/port-offset" ] && off=$(tr -dc '0-9' <"$_pilot_root/.state/port-offset")
    off=${off:-0}
    local pg=$((55432 + off)) redis=$((56379 + off)) amqp=$((56720 + off))

    if [ "$test_mode" = 1 ]; then
        _pilot_default REDIS_URL "redis://127.0.0.1:$redis/1"
        _pilot_default CELERY_BROKER_URL "amqp://guest:guest@127.0.0.1:$amqp/pilot_test"
        _pilot_default EVOLUTION_RABBITMQ_URL "amqp://guest:guest@127.0.0.1:$amqp/pilot_test"
        # the simulator's own tests (tests/simulator/conftest.py) default to port 56720
        _pilot_default SIMULATOR_TEST_RABBITMQ_URL "amqp://guest:guest@127.0.0.1:$amqp/"
        # The typing delay (on by default: messaging/sending/typing_delay.py) is off in tests, so that a
        # test's timings are its own; tests/messaging/test_typing.py turns it on where it is the subject.
        _pilot_default TYPING_DELAY_MS_PER_CHAR 0
        _pilot_default TYPING_DELAY_OTP_MS 0
        # Tests run their webhook receivers on 127.0.0.1; tests/callbacks/test_addresses.py turns the
        # guard back on where it is the subject (docs/security.md "Callbacks"). Production mode refuses
        # the setting except in a test stack, which says so (pilot_status/production.py).
        _pilot_default CALLBACKS_ALLOW_PRIVATE_ADDRESSES true
        _pilot_default PILOT_TEST_STACK 1
    else
        _pilot_load_dotenv "$_pilot_root/.env"
    fi

    _pilot_default DATABASE_URL "postgres://pilot:pilot@127.0.0.1:$pg/pilot_status"
    _pilot_default REDIS_URL "redis://127.0.0.1:$redis/0"
    _pilot_default CELERY_BROKER_URL "amqp://guest:guest@127.0.0.1:$amqp//"
    _pilot_default EVOLUTION_API_URL "http://127.0.0.1:8081"
    _pilot_default EVOLUTION_API_KEY "simulator-global-key"
    # Evolution's events on their own vhost, apart from Celery's tasks (compose also gives each its
    # own user; here guest, which RabbitMQ only lets in from loopback).
    _pilot_default EVOLUTION_RABBITMQ_URL "amqp://guest:guest@127.0.0.1:$amqp/evolution"
    _pilot_default EVOLUTION_RABBITMQ_EXCHANGE "evolution_exchange"
    _pilot_dev_secrets
    # Production mode (DEBUG=0) refuses `*`; these are the names `make run` and the tests use
    # (Django's test client adds its own `testserver`).
    _pilot_default ALLOWED_HOSTS "127.0.0.1,localhost,[::1]"
    # Plain HTTP on loopback: no redirect to https, no Secure-only cookies, no HSTS (production
    # mode turns them on by default; docs/security.md).
    _pilot_default SECURE_SSL_REDIRECT "0"
    _pilot_default SESSION_COOKIE_SECURE "0"
    _pilot_default CSRF_COOKIE_SECURE "0"
    _pilot_default SECURE_HSTS_SECONDS "0"
    _pilot_default PORT "8000"
    # The client API's sync workers (Procfile `web`): one per core, since its requests are CPU-bound.
    _pilot_default WEB_CONCURRENCY "$(nproc 2>/dev/null || echo 2)"
    # The webhook pool (Procfile `webhook`): Evolution's events and our own forwards, kept off
    # the client API's workers. PORT+1 is never one honcho hands out (it steps by 100).
    _pilot_default WEBHOOK_PORT "$((PORT + 1))"
    # Fixed here, not derived in the settings: honcho gives every process its own PORT (web keeps
    # the first), so the consumer and the reconciler would otherwise forward to a port no one has.
    # seed_demo also registers this URL as the simulator's webhook.
    _pilot_default INTERNAL_WEBHOOK_URL "http://127.0.0.1:$WEBHOOK_PORT/api/internal/webhook"
    # prometheus_client's multiprocess mode (pilot_status/observe.py): every process of `make run` writes its
    # histograms here and a scrape of either pool merges them; `make run` empties it first. The tests leave
    # it unset (each stack sets its own; the test process keeps its own registry).
    [ "$test_mode" = 1 ] || _pilot_default PROMETHEUS_MULTIPROC_DIR "$_pilot_root/.state/prometheus"
    _pilot_default DEBUG "0"
    _pilot_default DJANGO_SETTINGS_MODULE "pilot_status.settings"
    _pilot_default PYTHONUNBUFFERED "1" # honcho shows log lines as they come

    # The venv's gunicorn, celery, honcho and python first (the Procfile names them bare).
    case ":$PATH:" in
    *":$_pilot_root/.venv/bin:"*) ;;
    *) export PATH="$_pilot_root/.venv/bin:$PATH" ;;
    esac
}

_pilot_env "$@"

if [ "${BASH_SOURCE[0]}" != "$0" ]; then
    # sourced: keep the variables, drop the helpers
    unset -f _pilot_default _pilot_load_dotenv _pilot_env _pilot_random _pilot_dev_secrets
    unset _pilot_root
    return 0
fi

[ "${1:-}" = --test ] && shift
if [ $# -eq 0 ]; then
    for _v in DATABASE_URL REDIS_URL CELERY_BROKER_URL EVOLUTION_API_URL EVOLUTION_API_KEY \
        EVOLUTION_RABBITMQ_URL EVOLUTION_RABBITMQ_EXCHANGE INTERNAL_WEBHOOK_SECRET SECRET_KEY METRICS_TOKEN \
        PORT WEB_CONCURRENCY WEBHOOK_PORT INTERNAL_WEBHOOK_URL DEBUG ALLOWED_HOSTS \
        SECURE_SSL_REDIRECT SESSION_COOKIE_SECURE CSRF_COOKIE_SECURE SECURE_HSTS_SECONDS DJANGO_SETTINGS_MODULE; do
        printf '%s=%s\n' "$_v" "${!_v}"
    done
    exit 0
fi
exec "$@"
