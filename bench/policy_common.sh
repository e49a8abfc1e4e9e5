# bench/policy_common.sh — sourced by continuous_bench.sh and policy_windows.sh (the benches of
# continuous checkpointing, issue #21): their scratch directories and the posd they run jobs under.

# TMP (mktemp), and WORK: a directory named $1-XXXXXX for the restore points in $DIR, or when DIR is
# empty in /dev/shm if it has room for several images of the job (40 GB), else $TMPDIR. Both go
# when the script exits, with the posd of start_bench_posd.
bench_scratch() {
  TMP=$(mktemp -d)
  if [[ -z "$DIR" ]]; then
    local shm_gb
    shm_gb=$(df -Pk /dev/shm 2>/dev/null | awk 'NR==2{printf "%d", $4/1048576}')
    if [[ -n "$shm_gb" && "$shm_gb" -gt 40 ]]; then DIR=/dev/shm; else DIR="${TMPDIR:-/tmp}"; fi
  fi
  WORK=$(mktemp -d "$DIR/$1-XXXXXX")
  POSD_PID=""
  SOCK="$TMP/posd/posd.sock"
  trap bench_cleanup EXIT
}
bench_cleanup() {
  [[ -n "$POSD_PID" ]] && kill -TERM "$POSD_PID" 2>/dev/null && wait "$POSD_PID" 2>/dev/null
  rm -rf "$TMP" "$WORK"
}

# posd of $BUILD on backend $1 (host: with the MLP's host kernels) at $SOCK, its log in $TMP; returns
# once it answers (or after 20 s). POSD_PREFIX (an array, e.g. taskset -c LIST) goes before it. Its
# sessions page-lock their checkpoint staging as they start (posd.checkpoint_staging_ahead) and keep
# their copy-on-write shadows between ticks (checkpoint.keep_shadows: KEEP_SHADOWS, default true), as
# the sessions of jobs a YAML policy names do: a user running policies sets them.
declare -p POSD_PREFIX >/dev/null 2>&1 || POSD_PREFIX=()
start_bench_posd() {
  printf 'backend: %s\nlog_level: info\ncheckpoint:\n  keep_shadows: %s\nposd:\n  socket: %s\n  checkpoint_staging_ahead: true\n' \
    "$1" "${KEEP_SHADOWS:-true}" "$SOCK" >"$TMP/posd.yaml"
  [[ $1 == host ]] && printf '  host_kernel_libraries: [%s]\n' "$BUILD/workloads/libmlp_host_kernels.so" >>"$TMP/posd.yaml"
  "${POSD_PREFIX[@]}" "$BUILD/tools/posd" --config "$TMP/posd.yaml" 2>"$TMP/posd.log" &
  POSD_PID=$!
  for _ in $(seq 1 200); do "$BUILD/tools/pos-cli" ps --socket "$SOCK" >/dev/null 2>&1 && break; sleep 0.1; done
}
