#!/usr/bin/env bash
# sm_restore_check.sh — does a `pos run --sms N` job keep its SMs after pos-cli dumps and restores it?
# The gpu suite's sm_restore_gpu (issue #24; docs/limits.md, "SM limits of in-process jobs").
#
#   bash bench/sm_restore_check.sh BUILD_DIR [--sms 16]
#
# PyTorch runs workloads/torch_sms.py --rounds under `pos run --sms N`: each round a Triton kernel
# records the SMs its blocks ran on. pos-cli dumps it with --leave-running at round 3, then stops it
# with a dump at round 8 and restores it; every round, before and after both, must have run on
# exactly N SMs (the driver's SM group permitting: N a multiple of 8 on Hopper). Exit 0 when so.
set -uo pipefail
B="${1:?usage: sm_restore_check.sh BUILD_DIR [--sms N]}"; shift
B="$(cd "$B" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SMS=16
while [[ $# -gt 0 ]]; do
  case "$1" in
    --sms) SMS="${2:?}"; shift 2 ;;
    *) echo "usage: sm_restore_check.sh BUILD_DIR [--sms N]" >&2; exit 2 ;;
  esac
done
TMP=$(mktemp -d /tmp/sm-restore.XXXXXX)
export POS_JOBS_DIR="$TMP/jobs"
CLI="$B/tools/pos-cli" POS="$B/tools/pos"
JOB=""
cleanup() { [[ -n "$JOB" ]] && kill -KILL "$JOB" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
OUTF="$TMP/job.out"
wait_line() {  # wait_line PATTERN: until the job's output has a line matching it (at most 300 s)
  for _ in $(seq 1 6000); do grep -q "$1" "$OUTF" 2>/dev/null && return 0; sleep 0.05; done
  echo "never saw '$1'; the job printed:"; cat "$OUTF" "$OUTF.err" 2>/dev/null | tail -20; return 1
}
gone() { for _ in $(seq 1 4000); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.005; done; return 1; }

"$POS" run --sms "$SMS" -- python3 "$ROOT/workloads/torch_sms.py" --rounds 14 --gap 0.5 >"$OUTF" 2>"$OUTF.err" &
JOB=$!
wait_line "^round 2 " || exit 1
echo "== pos-cli dump --leave-running after round 2"
"$CLI" dump -t "$JOB" -D "$TMP/img-lr" --leave-running --json || { echo "dump --leave-running failed"; exit 1; }
wait_line "^round 7 " || exit 1
echo "== pos-cli dump (stop) after round 7, then pos-cli restore"
"$CLI" dump -t "$JOB" -D "$TMP/img-stop" --json || { echo "dump failed"; exit 1; }
gone "$JOB" || { echo "the job still runs after its stop dump"; exit 1; }
wait "$JOB" 2>/dev/null
before=$(grep -c '^round ' "$OUTF")
"$CLI" restore -D "$TMP/img-stop" --json || { echo "restore failed"; exit 1; }
wait_line "^done" || exit 1
cat "$OUTF"
after=$(( $(grep -c '^round ' "$OUTF") - before ))
echo "rounds before the stop dump: $before; after the restore: $after"
FAIL=0
[[ $after -ge 2 ]] || { echo "FAIL: fewer than 2 rounds ran after the restore"; FAIL=1; }
# The limit rounds up to the driver's SM group: what the first round saw is the granted count.
granted=$(sed -n 's/^round 0 smids \([0-9]*\).*/\1/p' "$OUTF")
[[ -n "$granted" && "$granted" -ge "$SMS" && "$granted" -lt $((SMS + 8)) ]] ||
  { echo "FAIL: the first round ran on '${granted}' SMs, not the $SMS asked"; FAIL=1; }
while read -r _ k _ n _; do
  [[ "$n" == "$granted" ]] || { echo "FAIL: round $k ran on $n SMs, not $granted"; FAIL=1; }
done < <(grep '^round ' "$OUTF")
[[ $FAIL == 0 ]] && echo "PASS: every round ran on $granted SMs, before and after the dumps and the restore"
exit $FAIL
