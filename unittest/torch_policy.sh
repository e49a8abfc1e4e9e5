#!/usr/bin/env bash
# torch_policy.sh — a GPU-only checkpoint policy on stock PyTorch (`pos run --checkpoint-every`),
# the gpu suite's test of an in-process job's policy (docs/continuous_checkpointing.md).
#
# Usage: unittest/torch_policy.sh BUILD [-- torch_train.py args...]
# The job (AdamW steps every parameter, so it rewrites nearly all of its device memory between
# ticks) runs natively, then under a policy every second with --keep 1 --full-every 3. Checks,
# else exit 1: its output equals the native run's; every tick made a complete point; the first
# incremental point left under a tenth of its bytes to earlier points and made the next three
# whole, so that incremental points are at most one in four; the policy ended with the job; and
# the directory holds the newest point alone, or with its parent if it is incremental (a chain
# would have kept up to four).
set -uo pipefail
B="${1:-}"; [[ -n "$B" && -d "$B" ]] || { echo "usage: $0 BUILD [-- torch_train.py args...]" >&2; exit 2; }
B="$(cd "$B" && pwd)"; shift
[[ "${1:-}" == "--" ]] && shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ARGS=("$@")
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--layers 2 --state-gib 1 --steps 4000)
TMP=$(mktemp -d /tmp/torch-policy.XXXXXX)
PTS=$(mktemp -d /dev/shm/torch-policy.XXXXXX)
trap 'rm -rf "$TMP" "$PTS"' EXIT
export POS_JOBS_DIR="$TMP/jobs"
FAIL=0
fail() { echo "FAIL: $*"; FAIL=1; }

python3 "$ROOT/workloads/torch_train.py" "${ARGS[@]}" >"$TMP/native.out" 2>"$TMP/native.err" ||
  { tail -5 "$TMP/native.err"; exit 1; }
"$B/tools/pos" run --checkpoint-every 1s -D "$PTS" --keep 1 --full-every 3 -- \
  python3 "$ROOT/workloads/torch_train.py" "${ARGS[@]}" >"$TMP/policy.out" 2>"$TMP/policy.err" ||
  { tail -5 "$TMP/policy.err"; exit 1; }
cmp -s "$TMP/native.out" "$TMP/policy.out" && echo "output identical to the native run ($(grep -c '^step ' "$TMP/policy.out") steps)" ||
  { fail "the output differs from the native run"; diff "$TMP/native.out" "$TMP/policy.out" | head -5; }

# The checkpointer is detached from the job: it sees the job gone within 50 ms and ends.
LOG="$PTS/checkpoint.log"
for _ in $(seq 1 600); do grep -q "the policy ends" "$LOG" 2>/dev/null && break; sleep 0.05; done
grep -q "the policy ends" "$LOG" || fail "the policy did not end with the job"
sed 's/^/  /' "$LOG" | cut -c1-200
WHOLE=$(grep -cE ': whole, [0-9.]+ MB written' "$LOG")
INCR=$(grep -cE ': on cp-[0-9]+, [0-9.]+ MB written' "$LOG")
FAILED=$(grep -cE ': failed after' "$LOG")
echo "ticks: $WHOLE whole, $INCR incremental, $FAILED failed"
[[ $FAILED -eq 0 ]] || fail "$FAILED ticks failed"
[[ $((WHOLE + INCR)) -ge 5 ]] || fail "fewer than 5 ticks: make the job longer"
grep -qE 'cp-000002 left [0-9.]+ % of its bytes to earlier points: the next 3 points are whole' "$LOG" ||
  fail "the first incremental point did not make the next ones whole"
# Incremental points: the second and every fourth after it (each makes the next three whole).
[[ $INCR -le $(( (WHOLE + INCR + 2) / 4 )) ]] || fail "$INCR incremental points of $((WHOLE + INCR)): chains went on"
POINTS=$(find "$PTS" -mindepth 1 -maxdepth 1 -type d -name 'cp-*' | wc -l)
OTHER=$(find "$PTS" -mindepth 1 -maxdepth 1 -name '.tmp-*' -o -mindepth 1 -maxdepth 1 -name '.del-*' | wc -l)
echo "points left: $POINTS ($OTHER unfinished or being deleted)"
# The newest point alone, or with its parent when it is the incremental one (the job may end right
# after one): never the chain of four.
NEWEST=$(grep -oE '^cp-[0-9]+: (whole|on cp-[0-9]+)' "$LOG" | tail -1)
WANT=1; [[ $NEWEST == *": on "* ]] && WANT=2
[[ $POINTS -eq $WANT && $OTHER -eq 0 ]] || { fail "expected $WANT point(s) after '$NEWEST'"; ls -a "$PTS"; }
"$B/tools/pos-cli" images "$PTS" | head -5
exit $FAIL
