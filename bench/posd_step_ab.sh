#!/usr/bin/env bash
# posd_step_ab.sh — the training step time natively and under posd, for two or more builds side by
# side in one run (A = baseline, B, … = candidates): each build's own posd + libpos_client, taking
# turns native, A, B, … so drift on the machine hits all; prints one table of medians and ratios.
#
# Usage: bench/posd_step_ab.sh BUILD_A BUILD_B [BUILD_C ...] [--runs N] [--backend cuda|host] [-- job args...]
# Every build dir must hold tools/posd, remoting/client/libpos_client.so (or remoting/libpos_client.so,
# the layout before the tree's split) and workloads/mlp_train_native; the native job of the first is run.
set -euo pipefail
usage() { echo "usage: $0 BUILD_A BUILD_B [BUILD_C ...] [--runs N] [--backend cuda|host] [-- job args...]" >&2; exit 2; }
BUILDS=() RUNS=8 BACKEND=cuda
while [[ $# -gt 0 ]]; do
  case "$1" in
    --runs) RUNS="${2:?}"; shift 2 ;;
    --backend) BACKEND="${2:?}"; shift 2 ;;
    --) shift; break ;;
    -*) usage ;;
    *) BUILDS+=("$1"); shift ;;
  esac
done
[[ ${#BUILDS[@]} -ge 2 && ${#BUILDS[@]} -le 26 ]] || usage
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || usage
[[ "$BACKEND" == cuda || "$BACKEND" == host ]] || usage
ARGS=("$@")
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--steps 300)
NAMES=(A B C D E F G H I J K L M N O P Q R S T U V W X Y Z)
CUDA_LIB=/usr/local/cuda/lib64
JOB="${BUILDS[0]}/workloads/mlp_train_native"
[[ -x "$JOB" ]] || { echo "posd_step_ab: $JOB is not an executable" >&2; exit 2; }

TMP=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; rm -rf "$TMP"; }
trap cleanup EXIT
CLIENT_LIBS=()
for ((k = 0; k < ${#BUILDS[@]}; k++)); do
  b=${BUILDS[$k]} sock="$TMP/posd-$k.sock" cfg="$TMP/posd-$k.yaml"
  lib="$b/remoting/client/libpos_client.so"
  [[ -f "$lib" ]] || lib="$b/remoting/libpos_client.so"
  [[ -x "$b/tools/posd" && -f "$lib" ]] || { echo "posd_step_ab: $b lacks tools/posd or libpos_client.so" >&2; exit 2; }
  CLIENT_LIBS+=("$lib")
  printf 'backend: %s\nposd:\n  socket: %s\n' "$BACKEND" "$sock" >"$cfg"
  if [[ $BACKEND == host ]]; then
    printf '  host_kernel_libraries: [%s]\n' "$b/workloads/libmlp_host_kernels.so" >>"$cfg"
  fi
  "$b/tools/posd" --config "$cfg" 2>"$TMP/posd-$k.log" &
  PIDS+=($!)
  for i in $(seq 1 100); do [[ -S "$sock" ]] && "$b/tools/pos-cli" ps --socket "$sock" >/dev/null 2>&1 && break; sleep 0.1; done
done

# A run's mean step (the job prints "mean step time X ms" on stderr).
step() { "$@" 2>&1 >/dev/null | sed -n 's/.*mean step time \([0-9.]*\) ms.*/\1/p'; }
for ((i = 1; i <= RUNS; i++)); do
  echo "native $i $(LD_LIBRARY_PATH=$CUDA_LIB step "$JOB" "${ARGS[@]}")" >>"$TMP/rows"
  for ((k = 0; k < ${#BUILDS[@]}; k++)); do
    t=$(POS_SOCKET="$TMP/posd-$k.sock" LD_LIBRARY_PATH=$CUDA_LIB LD_PRELOAD="${CLIENT_LIBS[$k]}" step "$JOB" "${ARGS[@]}")
    echo "${NAMES[$k]} $i $t" >>"$TMP/rows"
  done
done
median() { sort -g | awk '{v[NR]=$1} END{print (NR%2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }
NATIVE=$(awk '$1=="native" && $3!="" {print $3}' "$TMP/rows" | median)
echo "job: mlp_train_native ${ARGS[*]}; backend $BACKEND; $RUNS runs each, alternating"
echo "| run as | median step ms | min | max | / native |"
echo "|---|---|---|---|---|"
for side in native "${NAMES[@]:0:${#BUILDS[@]}}"; do
  vals=$(awk -v s="$side" '$1==s && $3!="" {print $3}' "$TMP/rows" | sort -g)
  [[ -n "$vals" ]] || { echo "| $side | (no result) | | | |"; continue; }
  m=$(echo "$vals" | median)
  printf '| %s | %s | %s | %s | %.3f |\n' "$side" "$m" "$(echo "$vals" | head -1)" "$(echo "$vals" | tail -1)" \
    "$(awk -v a="$m" -v b="$NATIVE" 'BEGIN{print (b>0)?a/b:0}')"
done
