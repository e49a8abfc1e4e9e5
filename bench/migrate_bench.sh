#!/usr/bin/env bash
# migrate_bench.sh — issue #22's bench in one run: a job with ~8 GB of device state under posd A is
# live-migrated to posd B and back, against a stop-and-copy through pos-cli dump + restore into B,
# and NVIDIA's driver checkpoint + CRIU on the same program run natively. Downtime is what the job
# sees: its longest step gap minus its median, on the wall clock (a CRIU-restored process's
# monotonic clock does not count the time it was frozen). Both posd keep a spare session process
# (posd.spare_session): a restore does not wait for a context.
#
# On one host the migration is the live switch (the process stays, its GPU state moves): moves 1
# and 2 take the peer switch (the default: the device memory handed to the target and copied device
# to device, no rounds), move 3 pre-copy rounds through image files (--no-peer), and move 4 the
# CRIU path (--move-process), as a migration to another host does.
# --gpus A,B: posd A serves GPU A and posd B GPU B (issue #23: GPU -> GPU on one host); the run also
# measures the peer copy bandwidth between them and host <-> device (torch, where it is installed).
# --peer-moves N: only the peer switch, N moves back and forth (its spread; no other rows).
# --netns: posd B is "another host": a network namespace joined by a veth pair, both posd accepting
# migrations (posd.migration); the moves are A -> B and B -> A with --to IP:PORT (the image streamed
# over TCP, the process through CRIU), as between two hosts (docs/migration.md, "Across hosts"), then
# the same two moves with --no-stage.
# --no-baselines: the moves only (no stop-and-copy, no NVIDIA row): another shape in the same call.
# --toolkit-libs: the job under posd loads the toolkit's own libcudart / libcublas / libcublasLt, as
# before the stand-ins (remoting/client/cuda_libs, docs/remoting.md): CRIU then carries their pages.
#
# Usage: bench/migrate_bench.sh BUILD [--dir DIR] [--backend cuda|host] [--max-downtime MS] [--gpus A,B]
#        [--peer-moves N] [--netns] [--no-baselines] [--toolkit-libs] [-- job args...]
# (root, CRIU from tools/setup.sh; --backend host tries the script without a GPU: no NVIDIA part)
# Scratch images go under DIR (default: /dev/shm), removed after. Prints a table.
set -uo pipefail
usage() { echo "usage: $0 BUILD [--dir DIR] [--backend cuda|host] [--max-downtime MS] [--gpus A,B] [--peer-moves N] [--netns] [--no-baselines] [--toolkit-libs] [-- job args...]" >&2; exit 2; }
B="${1:-}"; [[ -n "$B" && "$B" != -* && -d "$B" ]] || usage; shift
B="$(cd "$B" && pwd)"  # absolute: the target's restore runs it from elsewhere (--netns)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR=/dev/shm BACKEND=cuda BUDGET=300 GPUS="" PEER_MOVES=0 NETNS=0 NOBASE=0 TOOLKIT=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --gpus) GPUS="${2:?}"; [[ $GPUS =~ ^[0-9]+,[0-9]+$ ]] || usage; shift 2 ;;
    --dir) DIR="${2:?}"; shift 2 ;;
    --backend) BACKEND="${2:?}"; shift 2 ;;
    --max-downtime) BUDGET="${2:?}"; shift 2 ;;
    --peer-moves) PEER_MOVES="${2:?}"; [[ $PEER_MOVES =~ ^[1-9][0-9]?$ ]] || usage; shift 2 ;;
    --netns) NETNS=1; shift ;;
    --no-baselines) NOBASE=1; shift ;;
    --toolkit-libs) TOOLKIT=1; shift ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
ARGS=("$@")
# 30 layers of 8192 x 8192 (8 GB of parameters), all but the last frozen: each step rewrites the
# trained layer, its gradients and the activations, a few hundred MB.
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--input 1024 --hidden 8192 --layers 30 --output 256 --batch 256 --frozen 29 --steps 100000000 --step-times)
# Restored trees are reparented to the nearest child subreaper: this shell, which reaps them.
if [[ -z "${POS_BENCH_SUBREAPER:-}" ]]; then
  export POS_BENCH_SUBREAPER=1
  exec python3 -c 'import ctypes, os, sys; ctypes.CDLL(None).prctl(36, 1, 0, 0, 0); os.execvp("bash", ["bash"] + sys.argv[1:])' "$0" "$B" --dir "$DIR" --backend "$BACKEND" --max-downtime "$BUDGET" ${GPUS:+--gpus "$GPUS"} $( ((PEER_MOVES > 0)) && echo --peer-moves "$PEER_MOVES") $( ((NETNS)) && echo --netns) $( ((NOBASE)) && echo --no-baselines) $( ((TOOLKIT)) && echo --toolkit-libs) -- "${ARGS[@]}"
fi
CRIU="$ROOT/tools/criu"
TMP=$(mktemp -d)
WORK=$(mktemp -d "$DIR/migrate-bench-XXXXXX")
PIDS=()
# POS_BENCH_LOGS=DIR keeps the jobs' step logs and the posd logs there (to check the table against them).
NS="" HERE=""
cleanup() {
  for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  [[ -n "$HERE" ]] && ip link del "$HERE" 2>/dev/null
  [[ -n "$NS" ]] && ip netns del "$NS" 2>/dev/null
  [[ -n "${POS_BENCH_LOGS:-}" ]] && mkdir -p "$POS_BENCH_LOGS" && cp "$TMP"/*.err "$TMP"/*.log "$POS_BENCH_LOGS"/ 2>/dev/null
  rm -rf "$TMP" "$WORK"
}
trap cleanup EXIT
now() { date +%s.%N; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a - b }'; }
gone() { for i in $(seq 1 4000); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.005; done; return 1; }
steps_so_far() { grep -c '^step .* time_ms' "$1"; }
lines() { grep -c '^step ' "$1" 2>/dev/null || echo 0; }
json() { sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" <<<"$1" | head -1; }
# The job's longest step-to-step gap (ms) after step line $2 of file $1, and its median gap before.
step_gap() {
  # Waits for steps after line $3 (the count when the command returned): a gap ends only once the
  # job runs again, which may be after the command returned (a restore) or just before it.
  local f=$1 from=$2 after=${3:-$2} max med
  local ok=no
  for i in $(seq 1 600); do [[ $(steps_so_far "$f") -gt $((after + 5)) ]] && ok=yes && break; sleep 0.05; done
  # A job that did not step on has no gap to report (it died, or never came back).
  if [[ $ok == no ]]; then echo "the job made no steps after the command: $(tail -2 "$f")" >&2; echo "nan nan"; return; fi
  # Step starts on the wall clock (wall_s, field 10), not the monotonic start_s: CRIU restores a
  # process with its monotonic clock set back by the time it was frozen, which would hide that part.
  max=$(grep '^step .* wall_s' "$f" | tail -n +$((from > 0 ? from : 1)) |
        awk '{ if (NR > 1 && ($10 - p) * 1000 > m) m = ($10 - p) * 1000; p = $10 } END { printf "%.1f", m }')
  med=$(grep '^step .* wall_s' "$f" | head -n "$from" | awk 'NR > 1 { print ($10 - p) * 1000 } { p = $10 }' | sort -n |
        awk '{ a[NR] = $1 } END { if (NR) printf "%.1f", a[int((NR + 1) / 2)]; else printf "0" }')
  echo "$max $med"
}
start_posd() {  # $1: name; $2: the GPU it serves (empty: all, sessions on the first)
  local sock="$TMP/$1/posd.sock"
  mkdir -p "$TMP/$1"
  printf 'backend: %s\nlog_level: info\nposd:\n  socket: %s\n  spare_session: true\n' "$BACKEND" "$sock" >"$TMP/$1.yaml"
  [[ -n "${2:-}" ]] && printf '  devices: [%s]\n' "$2" >>"$TMP/$1.yaml"
  [[ $BACKEND == host ]] && printf '  host_kernel_libraries: [%s]\n' "$B/workloads/libmlp_host_kernels.so" >>"$TMP/$1.yaml"
  # --netns: each posd accepts migrations on its side of the veth; the restore runs in this
  # script's mount namespace (where the job's files are) and in that posd's network namespace
  # (cli-here, cli-there), so that the job lives on the side of the veth it was moved to, and
  # its next move's pos-cli (run there too) streams across the veth, not within one namespace.
  ((NETNS)) && printf '  migration:\n    listen: %s:0\n    secret_file: %s\n    dir: %s\n    cli: %s\n' \
    "$(ip_of "$1")" "$TMP/secret" "$WORK/in-$1" "$TMP/cli-$( [[ $1 == a ]] && echo here || echo there)" >>"$TMP/$1.yaml"
  [[ $BACKEND == host && -n "${2:-}" ]] && printf 'host_backend:\n  device_count: 2\n' >>"$TMP/$1.yaml"
  if ((NETNS)) && [[ $1 == b ]]; then ip netns exec "$NS" "$B/tools/posd" --config "$TMP/$1.yaml" 2>"$TMP/$1.log" &
  else "$B/tools/posd" --config "$TMP/$1.yaml" 2>"$TMP/$1.log" &
  fi
  PIDS+=($!)
  for i in $(seq 1 300); do "$B/tools/pos-cli" ps --socket "$sock" >/dev/null 2>&1 && break; sleep 0.1; done
}
ip_of() { [[ $1 == a ]] && echo "$IP_A" || echo "$IP_B"; }
if ((NETNS)); then
  source "$ROOT/bench/netns_common.sh"
  TAG=$(( $$ % 100000 )) N=$(( $$ % 250 + 1 ))
  NS="pos-mb-$TAG" HERE="mba$TAG" THERE="mbb$TAG" IP_A="10.234.$N.1" IP_B="10.234.$N.2"
  netns_pair "$NS" "$HERE" "$THERE" "$IP_A" "$IP_B"
  migration_secret_and_cli "$TMP" "$B/tools/pos-cli"
  printf '#!/bin/sh\nexec nsenter --net=/run/netns/%s --mount=/proc/%d/ns/mnt %s "$@"\n' "$NS" $$ "$B/tools/pos-cli" >"$TMP/cli-there"
  chmod 700 "$TMP/cli-there"
fi
# The jobs print CLOCK_MONOTONIC seconds, the logs wall time: one pair of readings relates them.
echo "clocks: wall $(date +%s.%N) monotonic $(cut -d' ' -f1 /proc/uptime)"
if [[ -n $GPUS ]]; then start_posd a "${GPUS%,*}"; start_posd b "${GPUS#*,}"; else start_posd a; start_posd b; fi
A="$TMP/a/posd.sock" BS="$TMP/b/posd.sock"
if ((NETNS)); then
  PORT_A=$(port_of "$TMP/a.log" "$IP_A") PORT_B=$(port_of "$TMP/b.log" "$IP_B")
  [[ -n "$PORT_A" && -n "$PORT_B" ]] || { echo "the posd instances did not listen"; cat "$TMP/a.log" "$TMP/b.log"; exit 1; }
  echo "posd A on $IP_A:$PORT_A (here), posd B on $IP_B:$PORT_B (namespace $NS)"
fi
# --netns: the veth's raw TCP rate each way (one stream, Python sockets, 4 GB into nothing), the
# "link rate" of #22's total target: total / (state / that rate) is the table's last column.
PROBE_RX='import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
c, _ = s.accept(); buf = bytearray(8 << 20); mv = memoryview(buf); n = 0; t0 = None
while True:
    k = c.recv_into(mv)
    if k == 0: break
    if t0 is None: t0 = time.monotonic()
    n += k
print(f"{n / (time.monotonic() - t0) / 1e9:.2f}")'
PROBE_TX='import socket, sys, time
for _ in range(100):
    try: c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); break
    except OSError: time.sleep(0.05)
b = memoryview(bytearray(64 << 20))
for _ in range(int(sys.argv[3]) * 16): c.sendall(b)
c.close()'
probe_link() {  # $1: ab (A -> B) or ba; prints GB/s
  local port=$((20000 + RANDOM % 20000)) out
  if [[ $1 == ab ]]; then
    out=$(ip netns exec "$NS" python3 -c "$PROBE_RX" "$IP_B" "$port" & python3 -c "$PROBE_TX" "$IP_B" "$port" 4; wait)
  else
    out=$(python3 -c "$PROBE_RX" "$IP_A" "$port" & nsenter --net="/run/netns/$NS" python3 -c "$PROBE_TX" "$IP_A" "$port" 4; wait)
  fi
  echo "$out"
}
LINK_AB="" LINK_BA=""
if ((NETNS)); then
  LINK_AB=$(probe_link ab) LINK_BA=$(probe_link ba)
  echo "raw TCP across the veth (one stream, 4 GB): A -> B $LINK_AB GB/s, B -> A $LINK_BA GB/s"
fi
PEER=""
if [[ -n $GPUS && $BACKEND == cuda ]]; then
  echo "== copy bandwidth between GPU ${GPUS%,*} and GPU ${GPUS#*,} (torch: 1 GiB tensors, 10 copies each)"
  PEER=$(python3 - "${GPUS%,*}" "${GPUS#*,}" <<'PY' 2>&1
import sys, time
try:
    import torch
except ImportError:
    print("no torch here: not measured"); sys.exit(0)
a, b = int(sys.argv[1]), int(sys.argv[2])
n = 1 << 30
def rate(dst, src):
    dst.copy_(src); torch.cuda.synchronize(a); torch.cuda.synchronize(b)
    t = time.perf_counter()
    for _ in range(10): dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize(a); torch.cuda.synchronize(b)
    return 10 * n / (time.perf_counter() - t) / 1e9
x = torch.empty(n, dtype=torch.uint8, device=f"cuda:{a}")
y = torch.empty(n, dtype=torch.uint8, device=f"cuda:{b}")
h = torch.empty(n, dtype=torch.uint8, pin_memory=True)
print(f"peer access {a}<->{b}: {torch.cuda.can_device_access_peer(a, b)}; GPU {a} -> GPU {b} {rate(y, x):.1f} GB/s, "
      f"GPU {b} -> GPU {a} {rate(x, y):.1f} GB/s; GPU {a} -> pinned host {rate(h, x):.1f} GB/s, pinned host -> GPU {b} {rate(y, h):.1f} GB/s")
PY
)
  echo "$PEER"
fi
start_job() {  # $1: output file; the rest: env prefix
  local out=$1; shift
  env "$@" "$B/workloads/mlp_train_native" "${ARGS[@]}" </dev/null >>"$out" 2>>"$out.err" &
  JOB=$!
  PIDS+=($JOB)
  for i in $(seq 1 1200); do [[ $(steps_so_far "$out.err") -ge 20 ]] && return 0; sleep 0.1; done
  echo "the job did not reach step 20: $(tail -3 "$out.err")" >&2; return 1
}
# The job under posd finds POS's stand-ins for the toolkit's libraries first (unless --toolkit-libs).
LIBS=/usr/local/cuda/lib64
((TOOLKIT)) || LIBS="$B/remoting/client/cuda_libs:$LIBS"
echo "the job under posd loads $( ((TOOLKIT)) && echo "the toolkit's CUDA libraries" || echo "POS's stand-in CUDA libraries ($B/remoting/client/cuda_libs)")"
posenv() { echo POS_SOCKET="$1" POS_JOB_NAME=bench POS_ARENA_SIZE=1GiB LD_LIBRARY_PATH="$LIBS" LD_PRELOAD="$B/remoting/client/libpos_client.so"; }

declare -a MIG_REPORT MIG_GAP MIG_MED MIG_TOTAL
# Moves: A -> B and B -> A with the peer switch (the default on one host: the device memory handed
# over, copied device to device), A -> B live with pre-copy rounds through image files (--no-peer),
# B -> A moving the process (--move-process: rounds, then CRIU).
MOVE_FLAGS=("" "" "--no-peer" "--move-process")
MOVE_NAME=("A -> B, peer switch" "B -> A, peer switch" "A -> B, live, rounds through files (--no-peer)" "B -> A, --move-process (CRIU)")
if ((NETNS)); then
  # Moves 1-2 as pos-cli migrates by default (the target stages round 1); 3-4 with --no-stage (its
  # restore at the stop reads every byte from the received files), side by side in one run.
  MOVE_FLAGS=("--to $IP_B:$PORT_B --secret-file $TMP/secret" "--to $IP_A:$PORT_A --secret-file $TMP/secret"
              "--to $IP_B:$PORT_B --secret-file $TMP/secret --no-stage" "--to $IP_A:$PORT_A --secret-file $TMP/secret --no-stage")
  MOVE_NAME=("A -> B, across the veth (--to HOST:PORT)" "B -> A, across the veth (--to HOST:PORT)"
             "A -> B, across the veth, --no-stage" "B -> A, across the veth, --no-stage")
  echo "== POS: pos-cli migrate A -> B -> A across a veth pair (rounds streamed, the process through CRIU) (budget $BUDGET ms)"
elif [[ $PEER_MOVES -gt 0 ]]; then
  MOVE_FLAGS=() MOVE_NAME=()
  for ((i = 0; i < PEER_MOVES; ++i)); do
    MOVE_FLAGS+=(""); if ((i % 2 == 0)); then MOVE_NAME+=("A -> B, peer switch"); else MOVE_NAME+=("B -> A, peer switch"); fi
  done
  echo "== POS: pos-cli migrate, $PEER_MOVES moves by the peer switch, A -> B -> A ... (budget $BUDGET ms)"
else
  echo "== POS: pos-cli migrate A -> B -> A (peer switch), A -> B (--no-peer), B -> A (--move-process) (budget $BUDGET ms)"
fi
start_job "$TMP/job.out" $(posenv "$A") || exit 1
FROM=$A TO=$BS
for ((i = 0; i < ${#MOVE_FLAGS[@]}; ++i)); do
  S0=$(steps_so_far "$TMP/job.out.err")
  # The bytes the veth carried during the move (both ways, counted on this side): a stream within
  # one namespace would not show here.
  veth_bytes() { ((NETNS)) && echo $(( $(cat /sys/class/net/$HERE/statistics/rx_bytes) + $(cat /sys/class/net/$HERE/statistics/tx_bytes) )) || echo 0; }
  V0=$(veth_bytes)
  T0=$(now)
  if ((NETNS)); then
    # From the source's side of the veth: B -> A's pos-cli runs in B's network namespace.
    CLI="$B/tools/pos-cli"; ((i % 2 == 1)) && CLI="$TMP/cli-there"
    M=$("$CLI" migrate -t "$JOB" --socket "$FROM" --max-downtime "$BUDGET" --work-dir "$WORK" --json ${MOVE_FLAGS[$i]})
  else
    M=$("$B/tools/pos-cli" migrate -t "$JOB" --to "$TO" --socket "$FROM" --max-downtime "$BUDGET" --work-dir "$WORK" --json \
        ${MOVE_FLAGS[$i]})
  fi
  MIG_TOTAL[$i]=$(sub "$(now)" "$T0")
  echo "$M"
  MIG_REPORT[$i]=$M
  read -r MIG_GAP[$i] MIG_MED[$i] <<<"$(step_gap "$TMP/job.out.err" "$S0" "$(steps_so_far "$TMP/job.out.err")")"
  echo "job's steps: longest around the move ${MIG_GAP[$i]} ms, median before ${MIG_MED[$i]} ms; pos-cli took ${MIG_TOTAL[$i]} s"
  ((NETNS)) && echo "the veth carried $(python3 -c "print(f'{($(veth_bytes) - $V0) / 1e9:.2f}')") GB during the move"
  # Which GPU holds the job's memory now (its session process's), as the driver tells it.
  [[ $BACKEND == cuda ]] && nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader 2>/dev/null | sed 's/^/  on the GPU: /'
  [[ $BACKEND == cuda && $i == 0 ]] && nvidia-smi --query-gpu=index,uuid --format=csv,noheader 2>/dev/null | sed 's/^/  GPU: /' 
  # A move that failed left the job where it was: the next one starts from there too.
  grep -q '"where":"target"' <<<"$M" && T=$FROM FROM=$TO TO=$T
  sleep 3
done
kill -KILL "$JOB" 2>/dev/null; gone "$JOB"; sleep 1
rounds() {  # "bytes@seconds" per round, from a report
  grep -o '{"round":[^}]*}' <<<"$1" | sed -E 's/.*"bytes":([0-9]+),.*"seconds":([0-9.]+),.*/\1 \2/' |
    awk '{ printf "%s%.2f GB in %.2f s", (NR > 1 ? "; " : ""), $1 / 1e9, $2 }'
}

D="" SC_GAP="" SC_MED="" SC_TOTAL="" NV_GAP="" NV_MED="" NV_TOTAL=""
if [[ $PEER_MOVES -eq 0 && $NOBASE -eq 0 ]]; then
echo "== POS: stop-and-copy, pos-cli dump (the job ends) then restore --lazy into B"
start_job "$TMP/sc.out" $(posenv "$A") || exit 1
S0=$(steps_so_far "$TMP/sc.out.err")
T0=$(now)
D=$("$B/tools/pos-cli" dump -t "$JOB" -D "$WORK/img-stop" --mode async --json --socket "$A")
gone "$JOB"; wait "$JOB" 2>/dev/null
R=$("$B/tools/pos-cli" restore -D "$WORK/img-stop" --lazy --json --socket "$BS")
SC_TOTAL=$(sub "$(now)" "$T0")
echo "$D"; echo "$R"
read -r SC_GAP SC_MED <<<"$(step_gap "$TMP/sc.out.err" "$S0" "$(steps_so_far "$TMP/sc.out.err")")"
echo "job's steps: longest around the stop ${SC_GAP} ms, median ${SC_MED} ms; dump + restore ${SC_TOTAL} s"
kill -KILL "$JOB" 2>/dev/null; gone "$JOB"; rm -rf "$WORK/img-stop"; sleep 1

echo "== NVIDIA: cuda checkpoint API + CRIU, stop and copy, on the same program run natively"
if [[ $BACKEND == cuda ]] && start_job "$TMP/nv.out" LD_LIBRARY_PATH=/usr/local/cuda/lib64; then
  NJ=$JOB
  mkdir -p "$WORK/img-nv"
  S0=$(steps_so_far "$TMP/nv.out.err")
  T0=$(now)
  if "$B/bench/nv_ckpt" "$NJ" --only checkpoint && "$CRIU" dump -t "$NJ" -D "$WORK/img-nv" -o dump.log --shell-job -v4; then
    gone "$NJ"; wait "$NJ" 2>/dev/null
    if "$CRIU" restore -D "$WORK/img-nv" -o restore.log --shell-job --restore-detached -v4 &&
       "$B/bench/nv_ckpt" "$NJ" --only restore; then
      NV_TOTAL=$(sub "$(now)" "$T0")
      read -r NV_GAP NV_MED <<<"$(step_gap "$TMP/nv.out.err" "$S0" "$(steps_so_far "$TMP/nv.out.err")")"
    else
      grep -h "Error" "$WORK/img-nv/restore.log" | head -5
    fi
  else
    grep -h "Error" "$WORK/img-nv/dump.log" 2>/dev/null | head -5
  fi
  kill -KILL "$NJ" 2>/dev/null; gone "$NJ"
fi

fi  # not --peer-moves

echo
[[ -n $GPUS ]] && echo "posd A serves GPU ${GPUS%,*}, posd B GPU ${GPUS#*,}; the NVIDIA row stays on one GPU. ${PEER}"
echo "| | downtime: longest step gap - median (ms) | total (s) | rounds (GPU bytes, copy time) | stop: GPU bytes | pos-cli: stop + restore (s) | total / (state / round-1 rate) |$( ((NETNS)) && echo " total / (state / raw link rate) |")"
echo "|---|---|---|---|---|---|---|$( ((NETNS)) && echo "---|")"
for ((i = 0; i < ${#MOVE_FLAGS[@]}; ++i)); do
  M=${MIG_REPORT[$i]}
  B1=$(grep -o '"round":1,"bytes":[0-9]*' <<<"$M" | grep -o '[0-9]*$'); S1=$(grep -o '"round":1,[^}]*' <<<"$M" | sed -E 's/.*"seconds":([0-9.]+).*/\1/')
  if grep -q '"peer":true' <<<"$M"; then
    stop=$(awk -v b="$(json "$M" peer_bytes)" -v e="$(json "$M" peer_export_s)" -v c="$(json "$M" target_copy_s)" \
      'BEGIN { printf "%.2f GB handed over (export %.3f s, target handles + copy %.3f s)", b / 1e9, e, c }')
  else
    stop=$(awk -v b="$(json "$M" final_bytes)" -v c="$(json "$M" final_criu_bytes)" \
      'BEGIN { printf "%.2f GB", b / 1e9; if (c > 0) printf " (+ CRIU %.2f GB)", c / 1e9 }')
  fi
  grep -q '"where":"target"' <<<"$M" || stop="FAILED, the job stayed at the source: $(sed -n 's/.*"target_error":"\([^"]*\)".*/\1/p' <<<"$M")"
  # The state: round 1's GPU bytes and the job's memory as round 1 read it.
  RAW=""
  if ((NETNS)); then
    C1=$(grep -o '"round":1,[^}]*' <<<"$M" | sed -E 's/.*"criu_bytes":([0-9]+).*/\1/')
    L=$LINK_AB; ((i % 2 == 1)) && L=$LINK_BA
    RAW=" $(awk -v t="${MIG_TOTAL[$i]}" -v b="$B1" -v c="${C1:-0}" -v l="$L" 'BEGIN { if (l > 0) printf "%.2f", t / ((b + c) / 1e9 / l); else print "-" }') |"
  fi
  echo "| POS migrate ${MOVE_NAME[$i]} ($(sed -n 's/.*"stop_reason":"\([a-z-]*\)".*/\1/p' <<<"$M")) | $(sub "${MIG_GAP[$i]}" "${MIG_MED[$i]}") | ${MIG_TOTAL[$i]} | $(rounds "$M") | $stop | $(json "$M" dump_s) + $(json "$M" restore_s) | $(awk -v t="${MIG_TOTAL[$i]}" -v s="$S1" 'BEGIN { if (s > 0) printf "%.2f", t / s; else print "-" }') |$RAW"
done
X=""; ((NETNS)) && X=" - |"
[[ $PEER_MOVES -eq 0 && $NOBASE -eq 0 ]] && echo "| POS stop-and-copy (dump A + restore --lazy into B, through host memory) | $(sub "$SC_GAP" "$SC_MED") | $SC_TOTAL | - | $(awk -v b="$(json "$D" gpu_bytes)" 'BEGIN { printf "%.2f GB", b / 1e9 }') | - | - |$X"
[[ $PEER_MOVES -eq 0 && $NOBASE -eq 0 ]] && echo "| NVIDIA API + CRIU stop-and-copy | ${NV_GAP:+$(sub "$NV_GAP" "$NV_MED")} | ${NV_TOTAL:-failed} | - | whole process | - | - |$X"
# Through CRIU (--netns, --move-process): where pos-cli's downtime went, from its report (ms).
if grep -q '"stop_criu_s":[0-9.]*[1-9]' <<<"${MIG_REPORT[*]}"; then
  echo
  echo "| move | pos-cli downtime | cut | GPU part saved (from the stop) | of it sent while drained (MB) | rest of it sent | CRIU dump | image | rest sent | pid free | target restore (of it CRIU) | commit |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
  for ((i = 0; i < ${#MOVE_FLAGS[@]}; ++i)); do
    M=${MIG_REPORT[$i]}
    grep -q '"stop_criu_s":[0-9.]*[1-9]' <<<"$M" || continue
    ms() { awk -v x="$(json "$M" "$1")" 'BEGIN { printf "%.0f", x * 1000 }'; }
    mb() { awk -v x="$(json "$M" "$1")" 'BEGIN { printf "%.0f", x / 1e6 }'; }
    echo "| ${MOVE_NAME[$i]} | $(ms downtime_s) | $(ms stop_cut_s) | $(ms stop_gpu_part_s) | $(mb final_sent_draining) of $(mb final_sent_early) | $(ms stop_early_send_s) | $(ms stop_criu_s) | $(ms stop_image_s) | $(ms final_send_s) | $(ms pid_free_s) | $(ms target_restore_s) ($(ms target_criu_s)) | $(ms commit_s) |"
  done
fi
grep -o '"stop_reason":"[a-z-]*"' <<<"${MIG_REPORT[0]}" >/dev/null || exit 1
