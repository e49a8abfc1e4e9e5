#!/usr/bin/env bash
# cut_consistency.sh — GPU-only checkpoints (pos-cli pre-dump) of a job whose device work races the
# checkpoint's copies (unittest/cut_probe.cu under `pos run`) must each hold the buffers exactly as
# they were at one cut: every buffer uniform, and the values those of a prefix of the job's updates.
# The cuts alternate between copies that run ahead of the job (the default) and copies ordered
# before all of its later work (POS_SNAP_AHEAD=0); at least one cut that ran ahead must have made
# the job's work wait for a copy (so the race was there to lose). Exit 1 on any failure.
#
# With --graphs the probe updates its buffers by CUDA graph launches (cut_probe.cu), and the job's
# census must show every launch's graph read at instantiation (graph_writes: launches_read > 0,
# launches_unread 0), so the waits were the graphs' own, not the wait for every copy.
#
# Usage: unittest/cut_consistency.sh BUILD PROBE [CUTS] [--graphs]
#        (gpu suite: cut_consistency_gpu, cut_consistency_graphs_gpu)
set -uo pipefail
B="${1:?usage: cut_consistency.sh BUILD PROBE [CUTS] [--graphs]}" PROBE="${2:?}" CUTS="${3:-12}" GRAPHS="${4:-}"
[[ -z "$GRAPHS" || "$GRAPHS" == --graphs ]] || { echo "cut_consistency.sh: unknown option $GRAPHS"; exit 2; }
TMP=$(mktemp -d /tmp/cut-consistency.XXXXXX)
IMG=$(mktemp -d /dev/shm/cut-consistency.XXXXXX)
JOB=""
cleanup() { [[ -n "$JOB" ]] && kill -9 "$JOB" 2>/dev/null; rm -rf "$TMP" "$IMG"; }
trap cleanup EXIT
export POS_JOBS_DIR="$TMP/jobs"
"$B/tools/pos" run -- "$PROBE" --buffers 8 --mib 256 --seconds 300 $GRAPHS >"$TMP/out" 2>"$TMP/err" &
JOB=$!
for _ in $(seq 1 600); do grep -q '^ready' "$TMP/out" 2>/dev/null && break; kill -0 "$JOB" 2>/dev/null || break; sleep 0.1; done
grep -q '^ready' "$TMP/out" || { echo "the probe did not start: $(tail -5 "$TMP/err")"; exit 1; }
FAIL=0 WAITED=0
for i in $(seq 1 "$CUTS"); do
  ahead=$(( i % 2 ))
  if ! POS_SNAP_AHEAD=$ahead "$B/tools/pos-cli" pre-dump -t "$JOB" -D "$IMG/$i" --json >"$TMP/cut.json" 2>"$TMP/cut.err"; then
    echo "cut $i: pre-dump failed: $(cat "$TMP/cut.err")"; FAIL=1; continue
  fi
  python3 - "$IMG/$i/gpu" "$TMP/out" "$TMP/cut.json" "$ahead" <<'PY' || FAIL=1
import json, os, sys
gpu, out, report, ahead = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), sys.argv[4] == "1"
buffers = {}  # address -> index
for line in open(out):
    f = line.split()
    if f and f[0] == "buffer":
        buffers[int(f[2], 16)] = int(f[1])
n = len(buffers)
chunk = files = None
regions = []
for line in open(os.path.join(gpu, "regions")):
    f = line.split()
    if f[0] == "chunk": chunk = int(f[1])
    elif f[0] == "files": files = int(f[1])
    elif f[0] == "region": regions.append((int(f[2], 16), int(f[3])))
    elif f[0] == "inherit": sys.exit(f"an inherited region in a whole image: {line.strip()}")
# Chunk g of the table (counted over all regions) lies in memory file g mod F, after that file's
# earlier chunks (docs/image_format.md, "Driver memory image").
at = [0] * files
g = 0
values, problems = {}, []
handles = [open(os.path.join(gpu, f"memory.{k}.bin"), "rb") for k in range(files)]
for addr, size in regions:
    seen = set()
    for off in range(0, size, chunk):
        n_bytes = min(chunk, size - off)
        k = g % files
        if addr in buffers:
            handles[k].seek(at[k])
            data = handles[k].read(n_bytes)
            if data != data[:4] * (n_bytes // 4):
                problems.append(f"buffer {buffers[addr]} is not uniform in its chunk at {off}")
            seen.add(int.from_bytes(data[:4], "little"))
        at[k] += n_bytes
        g += 1
    if addr in buffers:
        if len(seen) != 1: problems.append(f"buffer {buffers[addr]} holds several values: {sorted(seen)}")
        values[buffers[addr]] = max(seen)
if len(values) != n: problems.append(f"{len(values)} of the {n} buffers are in the image")
K = max(values.values()) if values else 0
for b, v in sorted(values.items()):
    want = max((u for u in range(max(1, K - n + 1), K + 1) if (u - 1) % n == b), default=0)
    if v != want: problems.append(f"buffer {b} holds update {v}, a cut after update {K} has {want}")
if report.get("gpu_ahead") != ahead: problems.append(f"gpu_ahead is {report.get('gpu_ahead')}, asked {ahead}")
waits = report.get("gpu_ahead_waits", 0)
print(f"cut ({'ahead' if ahead else 'ordered before all'}): after update {K}, {n} buffers consistent"
      if not problems else "cut: " + "; ".join(problems[:6]), f"(job waits {waits}, stall {report['phases']['gpu_stall_s']*1e3:.3f} ms, copy {report['phases']['job_save_s']*1e3:.1f} ms)")
sys.exit(1 if problems else 0)
PY
  w=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1])).get("gpu_ahead_waits", 0))' "$TMP/cut.json")
  [[ "$ahead" == 1 && "$w" -gt 0 ]] && WAITED=$((WAITED + 1))
  rm -rf "${IMG:?}/$i"
  kill -0 "$JOB" 2>/dev/null || { echo "the probe ended early: $(tail -5 "$TMP/err")"; FAIL=1; break; }
  sleep 0.2
done
[[ $WAITED -gt 0 ]] || { echo "no cut that ran ahead made the job's work wait for a copy: the race was never run"; FAIL=1; }
echo "cuts that ran ahead with the job's work waiting: $WAITED"
if [[ -n "$GRAPHS" ]]; then
  "$B/tools/pos-cli" ps --json >"$TMP/ps.json" 2>"$TMP/ps.err" || { echo "pos-cli ps failed: $(cat "$TMP/ps.err")"; FAIL=1; }
  python3 - "$TMP/ps.json" "$JOB" <<'PY' || FAIL=1
import json, sys
pid = int(sys.argv[2])
def find(v):  # the job's graph_writes, wherever ps puts the job
    if isinstance(v, dict):
        if v.get("pid") == pid and isinstance(v.get("census"), dict): return v["census"].get("graph_writes")
        for x in v.values():
            r = find(x)
            if r is not None: return r
    elif isinstance(v, list):
        for x in v:
            r = find(x)
            if r is not None: return r
    return None
g = find(json.load(open(sys.argv[1])))
if g is None: sys.exit("the job's census has no graph_writes")
print(f"graphs: {g}")
if g.get("graphs_read", 0) < 8 or g.get("launches_read", 0) == 0 or g.get("launches_unread", 1) != 0:
    sys.exit("not every graph launch had its graph read at instantiation")
PY
fi
kill "$JOB" 2>/dev/null; wait "$JOB" 2>/dev/null; JOB=""
[[ $FAIL -eq 0 ]] && echo "cut_consistency: OK" || echo "cut_consistency: FAILED"
exit $FAIL
