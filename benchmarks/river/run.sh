#!/usr/bin/env bash
# Run River's own benchmark (`river bench`) on a Postgres database.
# Usage: benchmarks/river/run.sh DSN N
#   DSN  postgres://user@host:port/db[?pool_max_conns=K]   (a DEVELOPMENT database:
#        `river bench` TRUNCATEs river_job and VACUUMs it before it starts)
#   N    number of no-op jobs: inserted in batches of 5000 with InsertMany before the
#        client starts, then worked down until none is left (`--num-total-jobs N`)
# Env:
#   RIVER                    binary (default ${RIVERBUILD:-/tmp/riverbuild}/river; build.sh makes it)
#   RIVER_BENCH_MAX_WORKERS  MaxWorkers of the default queue (default 2000 = River's stock
#                            bench value; honoured by binaries built with build.sh)
# Output: migrate-up output, River's per-2-s lines and its final summary line
#   "bench: total jobs worked [ N ], total jobs inserted [ N ], overall job/sec [ X ], running T"
# and, as the last line, X alone (jobs/s = jobs worked / (time the last job was seen
# completed - client start), as River computes it).
# Notes: pgxpool's pool size defaults to max(4, CPUs); set it with ?pool_max_conns=K.
# River's client fetch settings in bench: FetchCooldown 2ms, FetchPollInterval 20ms.
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 DSN N" >&2; exit 2; }
DSN=$1 N=$2
RIVER=${RIVER:-${RIVERBUILD:-/tmp/riverbuild}/river}
[ -x "$RIVER" ] || { echo "run.sh: $RIVER not found; run build.sh first (or set RIVER)" >&2; exit 1; }

"$RIVER" migrate-up --database-url "$DSN"
echo "run.sh: bench N=$N max_workers=${RIVER_BENCH_MAX_WORKERS:-2000}" >&2
out=$(mktemp); trap 'rm -f "$out"' EXIT
"$RIVER" bench --database-url "$DSN" --num-total-jobs "$N" | tee "$out"
line=$(grep 'overall job/sec' "$out" | tail -1)
[ -n "$line" ] || { echo "run.sh: no summary line from river bench" >&2; exit 1; }
worked=$(sed -E 's/.*total jobs worked \[ *([0-9]+) *\].*/\1/' <<<"$line")
[ "$worked" = "$N" ] || echo "run.sh: warning: worked $worked of $N jobs" >&2
sed -E 's/.*overall job\/sec \[ *([0-9.]+) *\].*/\1/' <<<"$line"
