#!/usr/bin/env bash
# torch_migrate_host.sh — stock PyTorch under `pos run` moved to another host's posd mid-run with
# `pos-cli migrate --to HOST:PORT`, and back (issue #22; docs/migration.md, "In-process jobs to
# another host"). The "other host" is a network namespace joined by a veth pair, with a posd in it
# that accepts migrations (as in CI): the same GPU, the same files. The job's whole output must
# equal a native run's. Prints each move's report and a table: the job's longest step gap around
# the move (its downtime as it sees it), migrate's own downtime, the rounds, the bytes sent.
#
#   bash bench/torch_migrate_host.sh BUILD_DIR [--at N] [--moves M] [-- TRAIN_ARGS...]
#
# The gpu suite's torch_migrate_host_gpu runs it small; the bench runs it with --state-gib 8.
# Needs root (network namespaces, CRIU: tools/install_criu.sh).
set -uo pipefail
usage() { echo "usage: torch_migrate_host.sh BUILD_DIR [--at N] [--moves M] [-- TRAIN_ARGS...]" >&2; exit 2; }
B="${1:-}"; [[ -n "$B" && -d "$B" ]] || usage; shift
B="$(cd "$B" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
AT=20 MOVES=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --at) AT="${2:?}"; shift 2 ;;
    --moves) MOVES="${2:?}"; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
ARGS=("$@")
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--layers 2 --dim 256 --steps 600)
# Images in memory where there is room (the rounds, the stop and what the target receives), as a
# migration's default work directory is.
SHM_FREE=$(df -Pk /dev/shm 2>/dev/null | awk 'NR == 2 { print int($4 / 1048576) }')
if [[ ${SHM_FREE:-0} -ge 48 ]]; then TMP=$(mktemp -d /dev/shm/torch-mig.XXXXXX); else TMP=$(mktemp -d /tmp/torch-mig.XXXXXX); fi
export POS_JOBS_DIR="$TMP/jobs"
CLI="$B/tools/pos-cli" POS="$B/tools/pos" POSD="$B/tools/posd"
TAG=$(( $$ % 100000 )) N=$(( $$ % 250 + 1 ))
NS="pos-tmh-$TAG" HERE="tma$TAG" THERE="tmb$TAG" IP_A="10.233.$N.1" IP_B="10.233.$N.2"
JOB="" POSD_A="" POSD_B=""
cleanup() {
  [[ -n "$JOB" ]] && kill -KILL "$JOB" 2>/dev/null
  for p in $POSD_A $POSD_B; do kill -TERM "$p" 2>/dev/null; done
  sleep 0.5
  ip link del "$HERE" 2>/dev/null; ip netns del "$NS" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT
now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
lines() { grep -c '^step ' "$1" 2>/dev/null || echo 0; }
json() { sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" <<<"$1" | head -1; }
wait_step() { for _ in $(seq 1 12000); do grep -q "^step $2 loss" "$1" 2>/dev/null && return 0; sleep 0.05; done; return 1; }
wait_end() { for _ in $(seq 1 12000); do grep -q '^checksum ' "$1" 2>/dev/null && return 0; sleep 0.05; done; return 1; }

source "$ROOT/bench/netns_common.sh"
netns_pair "$NS" "$HERE" "$THERE" "$IP_A" "$IP_B"
# The target's pos-cli restores the job in this script's namespaces, where its files and GPU are.
migration_secret_and_cli "$TMP" "$CLI"
posd_yaml() {  # posd_yaml NAME IP: a posd that accepts migrations on IP
  mkdir -p "$TMP/$1"
  printf 'backend: host\nlog_level: info\nposd:\n  socket: %s\n  arena: 32MiB\n  migration:\n    listen: %s:0\n    secret_file: %s\n    dir: %s\n    cli: %s\n' \
    "$TMP/$1/posd.sock" "$2" "$TMP/secret" "$TMP/$1/in" "$TMP/cli-here" >"$TMP/$1.yaml"
}
posd_yaml a "$IP_A"; posd_yaml b "$IP_B"
"$POSD" --config "$TMP/a.yaml" </dev/null >/dev/null 2>"$TMP/a.log" & POSD_A=$!
ip netns exec "$NS" "$POSD" --config "$TMP/b.yaml" </dev/null >/dev/null 2>"$TMP/b.log" & POSD_B=$!
PORT_A=$(port_of "$TMP/a.log" "$IP_A") PORT_B=$(port_of "$TMP/b.log" "$IP_B")
[[ -n "$PORT_A" && -n "$PORT_B" ]] || { echo "the posd instances did not listen"; cat "$TMP/a.log" "$TMP/b.log"; exit 1; }

echo "== native reference"
python3 "$ROOT/workloads/torch_train.py" "${ARGS[@]}" >"$TMP/ref.out" 2>"$TMP/ref.err" || { tail -5 "$TMP/ref.err"; exit 1; }
head -1 "$TMP/ref.out"
echo "== pos run, moved $MOVES time(s) between two posd instances (this namespace and $NS), from step $AT"
OUTF="$TMP/job.out"
"$POS" run -- python3 "$ROOT/workloads/torch_train.py" "${ARGS[@]}" --step-times >"$OUTF" 2>"$OUTF.err" & JOB=$!
FAIL=0 ROWS=()
for m in $(seq 1 "$MOVES"); do
  at=$(( AT * m ))
  wait_step "$OUTF" "$at" || { echo "the job did not reach step $at"; tail -5 "$OUTF.err"; FAIL=1; break; }
  if (( m % 2 == 1 )); then TO="$IP_B:$PORT_B" WHERE="b ($NS)"; else TO="$IP_A:$PORT_A" WHERE="a (here)"; fi
  n0=$(lines "$OUTF")
  R=$("$CLI" migrate -t "$JOB" --to "$TO" --secret-file "$TMP/secret" --max-rounds 3 --work-dir "$TMP" --json 2>"$TMP/mig.err"); rc=$?
  echo "move $m to $WHERE: rc=$rc $R"; [[ $rc == 0 ]] || { cat "$TMP/mig.err"; FAIL=1; break; }
  grep -q '"where":"target"' <<<"$R" || { echo "the job did not move"; FAIL=1; break; }
  wait "$JOB" 2>/dev/null  # the source's copy (this script's child only before the first move)
  rounds=$(grep -o '"round":[0-9]*,"bytes":[0-9]*' <<<"$R" | sed 's/"round":\([0-9]*\),"bytes":\([0-9]*\)/\2/' |
           awk '{ printf "%s%.2f", (NR > 1 ? " + " : ""), $1 / 1e9 }')
  ROWS+=("| $m: to $WHERE | $(json "$R" downtime_s) | $(json "$R" dump_s) | $(json "$R" restore_s) | $(json "$R" total_s) | $rounds | $(awk -v b="$(json "$R" final_bytes)" 'BEGIN { printf "%.2f", b / 1e9 }') | $(awk -v b="$(json "$R" final_criu_bytes)" 'BEGIN { printf "%.2f", b / 1e9 }') | $n0 |")
done
if [[ $FAIL == 0 ]]; then
  wait_end "$OUTF" || { echo "the job did not finish"; tail -5 "$OUTF.err"; FAIL=1; }
  if cmp -s "$TMP/ref.out" "$OUTF"; then echo "moved job: identical to the native run ($(lines "$OUTF") steps, checksum)";
  else echo "moved job: DIFFERS from the native run"; diff "$TMP/ref.out" "$OUTF" | head -5; tail -5 "$OUTF.err"; FAIL=1; fi
fi
# The job's own view: its longest gaps between step starts (--step-times: "step N start_s T" on stderr).
step_gaps() { awk '$1 == "step" && $3 == "start_s" { if (p) printf "%.3f\n", $4 - p; p = $4 }' "$OUTF.err" | sort -g; }
GAPS=$(step_gaps | tail -"$MOVES" | tr '\n' ' ')
MED=$(step_gaps | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }')
echo
echo "| move | migrate's downtime (s) | stop: dump + send (s) | restore there (s) | total (s) | rounds: GB sent | stop: GPU GB | stop: CPU GB (CRIU) | at step |"
echo "|---|---|---|---|---|---|---|---|---|"
for r in "${ROWS[@]}"; do echo "$r"; done
echo "the job's longest step gaps (s): $GAPS(median step ${MED:-?} s)"
exit $FAIL
