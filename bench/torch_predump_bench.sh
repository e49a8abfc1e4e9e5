#!/usr/bin/env bash
# torch_predump_bench.sh — GPU-only checkpoints (pos-cli pre-dump) of stock PyTorch
# (workloads/torch_train.py) under `pos run`, taken every few seconds while it trains: the job's
# whole output must equal a native run's (losses and checksum), and every allocation a checkpoint
# calls unwritten since the one before must hold the same bytes in both images (the launch scan
# missed no write), else exit 1. Prints a table: step times natively, under pos run, and under pos
# run with the checkpoints; the stall at each cut, the device-side copy, the write (docs/BENCHMARKS.md).
#
# Usage: bench/torch_predump_bench.sh BUILD [--every S] [--dir D] [-- torch_train.py args...]
# --dir: where the images go (default /dev/shm: the write is not the figure judged here).
set -uo pipefail
usage() { echo "usage: $0 BUILD [--every S] [--dir D] [-- torch_train.py args...]" >&2; exit 2; }
B="${1:-}"; [[ -n "$B" && "$B" != -* ]] || usage; shift
B="$(cd "$B" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EVERY=2 DIR=/dev/shm
while [[ $# -gt 0 ]]; do
  case "$1" in
    --every) EVERY="${2:?}"; shift 2 ;;
    --dir) DIR="${2:?}"; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
ARGS=("$@")
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--layers 2 --dim 256 --steps 600)
TMP=$(mktemp -d /tmp/torch-predump.XXXXXX)
IMG=$(mktemp -d "$DIR/pos-predump.XXXXXX")
export POS_JOBS_DIR="$TMP/jobs"
CLI="$B/tools/pos-cli" POS="$B/tools/pos"
JOB=""
cleanup() { [[ -n "$JOB" ]] && kill -KILL "$JOB" 2>/dev/null; rm -rf "$TMP" "$IMG"; }
trap cleanup EXIT
FAIL=0
# Step durations (ms) from --step-times' stderr lines: "mean median max n" of steps 2.. (the first
# includes warm-up).
steps() {
  python3 - "$1" <<'PY'
import sys, statistics
t = [float(l.split()[3]) for l in open(sys.argv[1]) if l.startswith("step ") and " start_s " in l]
d = [(b - a) * 1e3 for a, b in zip(t[1:], t[2:])]
print(f"{statistics.mean(d):.2f} {statistics.median(d):.2f} {max(d):.2f} {len(d)}" if d else "- - - 0")
PY
}
run() {  # run NAME PREFIX...: the job to its end, output in $TMP/NAME.out, step times in .err
  local name=$1; shift
  "$@" python3 "$ROOT/workloads/torch_train.py" "${ARGS[@]}" --step-times >"$TMP/$name.out" 2>"$TMP/$name.err"
}
same() {
  if cmp -s "$TMP/native.out" "$TMP/$1.out"; then echo "$1: identical to the native run ($(grep -c '^step ' "$TMP/$1.out") steps, checksum)";
  else echo "$1: DIFFERS from the native run"; diff "$TMP/native.out" "$TMP/$1.out" | head -5; tail -5 "$TMP/$1.err"; FAIL=1; fi
}

echo "== native"; run native env || { tail -5 "$TMP/native.err"; exit 1; }
head -1 "$TMP/native.out"
echo "== pos run"; run pos "$POS" run -- || { tail -5 "$TMP/pos.err"; exit 1; }
same pos

echo "== pos run, pos-cli pre-dump every $EVERY s"
"$POS" run -- python3 "$ROOT/workloads/torch_train.py" "${ARGS[@]}" --step-times >"$TMP/ckpt.out" 2>"$TMP/ckpt.err" &
JOB=$!
until grep -q '^step 1 ' "$TMP/ckpt.out" 2>/dev/null || ! kill -0 "$JOB" 2>/dev/null; do sleep 0.05; done
I=0 PREV=""
: >"$TMP/cuts.json"
while kill -0 "$JOB" 2>/dev/null; do
  sleep "$EVERY"
  kill -0 "$JOB" 2>/dev/null || break
  I=$((I + 1))
  if J=$("$CLI" pre-dump -t "$JOB" -D "$IMG/$I" --json 2>"$TMP/cut.err"); then
    echo "$J" >>"$TMP/cuts.json"
    # Every allocation called unwritten since the previous cut must hold the same bytes in both.
    if [[ -n "$PREV" ]]; then
      python3 - "$IMG/$PREV/gpu/regions" "$IMG/$I/gpu/regions" "$J" >>"$TMP/check.txt" <<'PY' || FAIL=1
import json, sys
def table(p):
    return {int(l.split()[2], 16): l.split()[3:5] + [l.split()[5]] for l in open(p) if l.startswith("region ")}
a, b, j = table(sys.argv[1]), table(sys.argv[2]), json.loads(sys.argv[3])
un = j["gpu_unwritten"]
changed = [u for u in un if u in a and (a[u][0] != b[u][0] or a[u][2] != b[u][2])]
print(f"cut: {len(b)} allocations, {len(un)} unwritten, {sum(1 for u in un if u in a)} of them compared, {len(changed)} changed")
sys.exit(1 if changed else 0)
PY
      rm -rf "$IMG/$PREV"
    fi
    PREV=$I
  else
    # One that raced the job's end (its socket goes as it exits, after its checksum) proves nothing.
    sleep 1
    if kill -0 "$JOB" 2>/dev/null && ! grep -q '^checksum ' "$TMP/ckpt.out"; then
      echo "pre-dump $I failed: $(cat "$TMP/cut.err")"; FAIL=1
    fi
  fi
done
wait "$JOB"; JOB=""
same ckpt
cat "$TMP/check.txt" 2>/dev/null | sort | uniq -c | head -5
grep -q " [1-9][0-9]* changed" "$TMP/check.txt" 2>/dev/null && { echo "an allocation called unwritten changed"; FAIL=1; }

read -r NM NMED NMAX NN <<<"$(steps "$TMP/native.err")"
read -r PM PMED PMAX PN <<<"$(steps "$TMP/pos.err")"
read -r CM CMED CMAX CN <<<"$(steps "$TMP/ckpt.err")"
STATS=$(python3 - "$TMP/cuts.json" <<'PY'
import json, sys, statistics
c = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
if not c:
    print("0 - - - - - - -"); sys.exit()
st = [x["phases"]["gpu_stall_s"] * 1e3 for x in c]
cp = [x["phases"]["job_save_s"] * 1e3 for x in c]
wr = [x["phases"]["gpu_s"] for x in c]
gb = statistics.mean(x["gpu_bytes"] for x in c) / 1e9
wb = statistics.mean(x["gpu_written_bytes"] for x in c[1:]) / 1e9 if len(c) > 1 else 0
print(f"{len(c)} {statistics.median(st):.3f} {max(st):.3f} {statistics.median(cp):.1f} {statistics.median(wr):.2f} {gb:.2f} {wb:.2f} {max(x['phases']['total_s'] for x in c):.2f}")
PY
)
read -r NC STMED STMAX CPMED WRMED GB WB TOT <<<"$STATS"
echo
echo "| torch_train.py $(head -1 "$TMP/native.out" | cut -d' ' -f2-) | native | pos run | pos run + pre-dump every $EVERY s |"
echo "|---|---|---|---|"
echo "| step time mean / median / max (ms), steps | $NM / $NMED / $NMAX, $NN | $PM / $PMED / $PMAX, $PN | $CM / $CMED / $CMAX, $CN |"
echo "| checkpoints taken | — | — | $NC |"
echo "| job's calls held at the cut: median / max (ms) | — | — | $STMED / $STMAX |"
echo "| device-side copy after the cut, median (ms) | — | — | $CPMED |"
echo "| pre-dump written (device memory to $DIR), median (s); longest pos-cli run (s) | — | — | $WRMED; $TOT |"
echo "| device memory per checkpoint / written since the one before, mean (GB) | — | — | $GB / $WB |"
echo
[[ $FAIL == 0 ]] && echo "all outputs identical to the native run; no allocation called unwritten changed" || echo "FAILED: see above"
exit $FAIL
