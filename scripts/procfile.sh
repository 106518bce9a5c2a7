#!/usr/bin/env bash
# Print the Procfile that `make run` gives honcho: ./Procfile, minus the `simulator` line when
# EVOLUTION_API_URL points somewhere other than the local simulator (README, "Set-up": then the
# whole stack runs against that Evolution API instead). ./Procfile is generated from the process
# topology (pilot_status/topology.py; a test keeps the two equal), where `simulator` is the one
# stand-in process.
#
#   scripts/env.sh scripts/procfile.sh > .state/Procfile
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
url=${EVOLUTION_API_URL:-}
url=${url%/}

case "$url" in
http://127.0.0.1:8081 | http://localhost:8081)
    cat "$root/Procfile"
    ;;
*)
    echo "procfile.sh: EVOLUTION_API_URL=$url is not the local simulator: not starting it" >&2
    grep -v '^simulator:' "$root/Procfile"
    ;;
esac
