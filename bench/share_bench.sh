#!/usr/bin/env bash
# share_bench.sh — GPU-time shares of in-process jobs on one GPU (issue #24, docs/limits.md): jobs
# that always want the GPU (workloads/torch_share.py, bf16 matmuls) run together under
# `pos run --gpu-share`, and each one's products per second say what part of the GPU it got. Prints
# tables (docs/BENCHMARKS.md): the shares of 2 and 4 jobs, a 30 % job alone against the same job
# with no share (work-conserving: it must not be held back), and the cost of limits set but not
# reached (a memory limit and a share, the GPU contended by an idle job) against none.
#
# --check (the gpu suite's share_gpu): only the 2-job shares and the job alone, and exit 1 unless
# the 70 % job gets 70 ± 5 % and the 30 % job alone runs at ≥ 95 % of the unshared job's rate.
#
# Usage: bench/share_bench.sh BUILD [--seconds S] [--check] [--runs N]
# Needs a GPU and PyTorch (python3).
set -uo pipefail
usage() { echo "usage: $0 BUILD [--seconds S] [--check] [--runs N]" >&2; exit 2; }
B="${1:-}"; [[ -n "$B" && "$B" != -* ]] || usage; shift
B="$(cd "$B" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECS=8 CHECK=0 RUNS=3
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seconds) SECS="${2:?}"; shift 2 ;;
    --check) CHECK=1; shift ;;
    --runs) RUNS="${2:?}"; shift 2 ;;
    *) usage ;;
  esac
done
TMP=$(mktemp -d /tmp/share-bench.XXXXXX)
export POS_JOBS_DIR="$TMP/jobs"
POS="$B/tools/pos" JOB="$ROOT/workloads/torch_share.py"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT

# run SPEC...: one job per SPEC, started together, timed together. SPEC: "native" (no pos run),
# "none" (pos run, no limits), "limits" (pos run --memory 64GiB --gpu-share 30%), or a share ("70%").
# RATES gets each job's products per second.
RATES=()
run() {
  local n=$# i=0 s
  rm -f "$TMP"/go "$TMP"/ready.* "$TMP"/out.*
  local pids=()
  for s in "$@"; do
    local pre=()
    case "$s" in
      native) pre=() ;;
      none) pre=("$POS" run --) ;;
      limits) pre=("$POS" run --memory 64GiB --gpu-share 30% --) ;;
      *) pre=("$POS" run --gpu-share "$s" --) ;;
    esac
    "${pre[@]}" python3 "$JOB" --ready "$TMP/ready.$i" --go "$TMP/go" --seconds "$SECS" >"$TMP/out.$i" 2>&1 &
    pids+=($!); PIDS+=($!); i=$((i + 1))
  done
  for ((k = 0; k < 1200; k++)); do
    [[ $(ls "$TMP"/ready.* 2>/dev/null | wc -l) -eq $n ]] && break
    sleep 0.1
  done
  touch "$TMP/go"
  for p in "${pids[@]}"; do wait "$p"; done
  RATES=()
  for ((k = 0; k < n; k++)); do
    local r; r=$(sed -n 's/.*rate \([0-9.]*\).*/\1/p' "$TMP/out.$k")
    if [[ -z "$r" ]]; then echo "job $k ($*) printed no rate:" >&2; tail -5 "$TMP/out.$k" >&2; r=0; fi
    RATES+=("$r")
  done
}
pct() { awk -v a="$1" -v t="$2" 'BEGIN { printf "%.1f", (t > 0 ? 100 * a / t : 0) }'; }
sum() { awk 'BEGIN { s = 0; for (i = 1; i < ARGC; i++) s += ARGV[i]; printf "%.2f", s }' "$@"; }

FAIL=0
echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); each window ${SECS} s"
echo
echo "| jobs | shares asked | products/s each | shares got | off by (points) |"
echo "|---|---|---|---|---|"
shares_row() {  # asked...
  run "$@"
  local total; total=$(sum "${RATES[@]}")
  local got="" off="" worst=0 k
  for ((k = 0; k < $#; k++)); do
    local asked="${@:$((k + 1)):1}"; asked="${asked%\%}"
    local g; g=$(pct "${RATES[$k]}" "$total")
    local d; d=$(awk -v g="$g" -v a="$asked" 'BEGIN { d = g - a; if (d < 0) d = -d; printf "%.1f", d }')
    [[ "${RATES[$k]}" == 0 ]] && d=100
    got+="${got:+ / }$g %"; off+="${off:+ / }$d"
    worst=$(awk -v w="$worst" -v d="$d" 'BEGIN { print ((d > w) ? d : w) }')
  done
  echo "| $# | $(IFS=/; echo "$*") | $(IFS=' '; echo "${RATES[*]}") | $got | $off |"
  WORST="$worst"
}
shares_row 70% 30%
awk -v w="$WORST" 'BEGIN { exit !(w <= 5) }' || { echo "FAIL: the 70/30 shares are off by $WORST points (more than 5)"; FAIL=1; }
if [[ $CHECK -eq 0 ]]; then
  shares_row 50% 50%
  shares_row 40% 30% 20% 10%
fi
echo
echo "| job alone | products/s | vs pos run with no limits |"
echo "|---|---|---|"
run none; BASE="${RATES[0]}"
run 30%; ALONE="${RATES[0]}"
echo "| pos run, no limits | $BASE | 1.000 |"
echo "| pos run --gpu-share 30% | $ALONE | $(awk -v a="$ALONE" -v b="$BASE" 'BEGIN { printf "%.3f", a / b }') |"
awk -v a="$ALONE" -v b="$BASE" 'BEGIN { exit !(a >= 0.95 * b) }' ||
  { echo "FAIL: a 30 % job alone ran at $ALONE products/s, less than 95 % of $BASE"; FAIL=1; }
[[ $CHECK -eq 1 ]] && exit $FAIL

# The cost of limits set but not reached: alternating runs of the same job alone with none, with a
# memory limit and a share, and natively; then with a share while an idle job with a share holds a
# slot on the same GPU (the GPU is contended: every launch asks for the turn, which it keeps).
echo
echo "| run | no limits | limits set | limits set, GPU contended by an idle job | native |"
echo "|---|---|---|---|---|"
for ((r = 1; r <= RUNS; r++)); do
  run none; a="${RATES[0]}"
  run limits; b="${RATES[0]}"
  # The idle job: ready, then it waits for a GO that never comes, holding its slot and its share.
  python_idle=("$POS" run --gpu-share 50% -- python3 "$JOB" --ready "$TMP/idle.ready" --go "$TMP/never" --seconds 1)
  rm -f "$TMP/idle.ready"; "${python_idle[@]}" >/dev/null 2>&1 & idle=$!; PIDS+=($idle)
  for ((k = 0; k < 1200; k++)); do [[ -f "$TMP/idle.ready" ]] && break; sleep 0.1; done
  run limits; c="${RATES[0]}"
  kill -KILL "$idle" 2>/dev/null; wait "$idle" 2>/dev/null
  run native; d="${RATES[0]}"
  echo "| $r | $a | $b ($(awk -v x="$b" -v y="$a" 'BEGIN { printf "%+.2f %%", 100 * (y / x - 1) }') step time) | $c ($(awk -v x="$c" -v y="$a" 'BEGIN { printf "%+.2f %%", 100 * (y / x - 1) }')) | $d |"
done
exit $FAIL
