#!/usr/bin/env bash
# The test suite in its two phases (`make test`; docs/operations.md "Test suite"):
#
#   scripts/test.sh [PYTEST ARGS...]        run through `scripts/env.sh --test`, services up
#
# 1. parallel: every selected test but the `serial` and `harness` ones, on TEST_WORKERS pytest-xdist workers
#    (default 2, one per core of the CI host), each with its own database, Redis database, RabbitMQ vhost,
#    logs and ports (tests/support/workers.py). `--dist loadgroup`: tests that share an expensive fixture
#    may be kept on one worker with `@pytest.mark.xdist_group`.
# 2. serial: the `serial` tests (they really stop or fault Postgres, Redis or RabbitMQ, which every worker
#    uses, or wait for every transaction of the Postgres server), one at a time in one process, once the
#    parallel phase is over; skipped when the arguments select none.
#
# The arguments go to both phases (a path, -k, -x, ...; `-n 0` runs the first phase in one process too).
# The exit status is the first phase's failure, else the second's; "no test selected" (5) only when
# neither phase ran a test.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
PYTEST="$ROOT/.venv/bin/pytest"
workers=${TEST_WORKERS:-2}
count_file=$(mktemp)
trap 'rm -f "$count_file"' EXIT

"$PYTEST" -n "$workers" --dist loadgroup --phase=parallel --serial-count-file="$count_file" "$@"
first=$?
serial=$(tr -dc '0-9' <"$count_file")
second=5
# 2 (interrupted), 3 (internal error) or 4 (usage error): no second phase.
if [ "${serial:-0}" -gt 0 ] && { [ "$first" = 0 ] || [ "$first" = 1 ] || [ "$first" = 5 ]; }; then
    echo "== serial phase: ${serial} test(s) that need the shared servers to themselves, run alone"
    "$PYTEST" --phase=serial "$@"
    second=$?
fi

for status in "$first" "$second"; do
    if [ "$status" != 0 ] && [ "$status" != 5 ]; then exit "$status"; fi
done
[ "$first" = 5 ] && [ "$second" = 5 ] && exit 5
exit 0
