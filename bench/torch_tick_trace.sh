#!/usr/bin/env bash
# torch_tick_trace.sh — where in a continuous-checkpointing tick a PyTorch job's slow steps fall
# (issue #21's worst-step target; docs/continuous_checkpointing.md). The job trains under `pos run`
# with --step-times; pos-cli pre-dump (the GPU-only checkpoint a policy tick of an in-process job
# takes) runs every GAP seconds, N times. For each tick: its phases from pos-cli's report (the cut:
# the job's shadow made, its streams held, the device copy; then the copy written to /dev/shm) and
# each step of the job over 1.2x the median that started within the tick or 1 s after it, at its
# offset from the tick's start. Outside the ticks, the job's own slow steps are counted too.
#
#   bash bench/torch_tick_trace.sh BUILD_DIR [--ticks 4] [--gap 6] [--cli-prefix 'nice -n 19']
#       [--variants 'off;POS_IMAGE_THREADS=4;...'] [-- TRAIN_ARGS...]
#
# --cli-prefix runs pos-cli under a command (nice, taskset): whether the job's slow steps come from
# the writer's CPU use. --variants: the ticks take turns among these (`-` for none, or environment
# assignments for pos-cli; `off` takes no tick, only waits --off-s seconds, a control), and a
# table gives each one's cost: the job's step time lost in a tick's window (the sum over the steps
# that began in it of each step less the mean step outside all windows), per tick.
set -uo pipefail
usage() { echo "usage: torch_tick_trace.sh BUILD_DIR [--ticks N] [--gap S] [--cli-prefix CMD] [-- TRAIN_ARGS...]" >&2; exit 2; }
B="${1:-}"; [[ -n "$B" && -d "$B" ]] || usage; shift
B="$(cd "$B" && pwd)"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TICKS=4 GAP=6 PREFIX="" VARIANTS="-" OFF_S=1.5
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ticks) TICKS="${2:?}"; shift 2 ;;
    --gap) GAP="${2:?}"; shift 2 ;;
    --cli-prefix) PREFIX="${2?}"; shift 2 ;;
    --variants) VARIANTS="${2:?}"; shift 2 ;;
    --off-s) OFF_S="${2:?}"; shift 2 ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
ARGS=("$@")
[[ ${#ARGS[@]} -gt 0 ]] || ARGS=(--layers 4 --state-gib 8 --steps 1500)
TMP=$(mktemp -d /dev/shm/tick-trace.XXXXXX)
export POS_JOBS_DIR="$TMP/jobs"
CLI="$B/tools/pos-cli" POS="$B/tools/pos"
JOB=""
cleanup() { [[ -n "$JOB" ]] && kill -KILL "$JOB" 2>/dev/null; rm -rf "$TMP"; }
trap cleanup EXIT
json() { local x; x=$(sed -n "s/.*\"$2\":\([0-9.]*\).*/\1/p" <<<"$1" | head -1); echo "${x:-0}"; }
jtext() { local x; x=$(sed -n "s/.*\"$2\":\"\([a-z-]*\)\".*/\1/p" <<<"$1" | head -1); echo "${x:--}"; }
OUTF="$TMP/job.out"
"$POS" run -- python3 "$ROOT/workloads/torch_train.py" "${ARGS[@]}" --step-times >"$OUTF" 2>"$OUTF.err" & JOB=$!
for _ in $(seq 1 6000); do grep -q '^step 60 ' "$OUTF" && break; sleep 0.05; done
grep -q '^step 60 ' "$OUTF" || { echo "the job did not reach step 60"; tail -5 "$OUTF.err"; exit 1; }
: >"$TMP/ticks"
IFS=';' read -r -a VAR <<<"$VARIANTS"
for i in $(seq 1 "$TICKS"); do
  v=$(( (i - 1) % ${#VAR[@]} ))
  t0=$(date +%s.%N)
  if [[ "${VAR[$v]}" == off ]]; then
    sleep "$OFF_S"
    t1=$(date +%s.%N)
    echo "$i $t0 $t1 0 0 0 0 0 $v 0 - 0" >>"$TMP/ticks"
  else
    ENVS=(); [[ "${VAR[$v]}" != - ]] && read -r -a ENVS <<<"${VAR[$v]}"
    R=$(env "${ENVS[@]}" $PREFIX "$CLI" pre-dump -t "$JOB" -D "$TMP/pd" --json 2>&1) || { echo "pre-dump $i failed: $R"; exit 1; }
    nice -n 19 rm -rf "$TMP/pd"  # inside the tick, as a policy's retention deletes a point each tick
    t1=$(date +%s.%N)
    echo "$i $t0 $t1 $(json "$R" cut_s) $(json "$R" gpu_stall_s) $(json "$R" job_save_s) $(json "$R" gpu_s) $(json "$R" gpu_bytes) $v $(json "$R" gpu_ahead_waits) $(jtext "$R" gpu_align) $(json "$R" gpu_align_s)" >>"$TMP/ticks"
  fi
  rm -rf "$TMP/pd"
  sleep "$GAP"
done
kill -TERM "$JOB" 2>/dev/null; wait "$JOB" 2>/dev/null; JOB=""
awk '$1 == "step" && $3 == "start_s" { print $2, $4 }' "$OUTF.err" >"$TMP/steps"
MED=$(awk 'NR > 1 { print $2 - p } { p = $2 }' "$TMP/steps" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }')
if [[ "$VARIANTS" != - ]]; then
  # Each variant's cost: step time lost in its ticks' windows against the median outside them all.
  OUTMED=$(awk 'FNR == NR { t0[$1] = $2; t1[$1] = $3; n = $1; next } { st[FNR] = $2; m = FNR }
    END { for (j = 61; j < m; ++j) { inside = 0
            for (i = 1; i <= n; ++i) if (st[j] >= t0[i] && st[j] <= t1[i] + 1) inside = 1
            if (!inside) print st[j + 1] - st[j] } }' "$TMP/ticks" "$TMP/steps" |
           sort -g | awk '{ a[NR] = $1; s += $1 } END { print a[int((NR + 1) / 2)], s / NR, NR }')
  read -r OMED OMEAN OCOUNT <<<"$OUTMED"
  # Lost time against the mean step outside (the median would count the distribution's skew as a
  # cost in every window, the control's too); slow steps against the median.
  awk -v vars="$VARIANTS" -v med="$OMED" -v mean="$OMEAN" -v k="$OCOUNT" 'FNR == NR { t0[$1] = $2; t1[$1] = $3; va[$1] = $9; wr[$1] = $7; al[$1] = $11; gb[$1] = $8 / 1e9; n = $1; next }
    { st[FNR] = $2; m = FNR }
    END {
      printf "outside the windows: median step %.4f s, mean %.4f s (%d steps)\n", med, mean, k
      printf "%-4s %-48s %5s %9s %11s %9s %7s %9s %8s %7s\n", "tick", "variant", "steps", "tick s", "lost ms", "> 1.2x", "worst", "written s", "cut at", "GB"
      nv = split(vars, name, ";")
      for (i = 1; i <= n; ++i) {
        lost = 0; slow = 0; worst = 0; c = 0
        for (j = 61; j < m; ++j) {
          if (st[j] < t0[i] || st[j] > t1[i] + 1) continue
          len = st[j + 1] - st[j]; ++c; lost += len - mean
          if (len > 1.2 * med) ++slow
          if (len > worst) worst = len
        }
        v = va[i] + 1
        printf "%-4d %-48s %5d %9.3f %11.1f %9d %6.2fx %9.3f %8s %7.2f\n", i, name[v], c, t1[i] - t0[i], lost * 1000, slow, worst / med, wr[i], al[i], gb[i]
        sum[v] += lost * 1000; sq[v] += (lost * 1000) ^ 2; cnt[v]++; sl[v] += slow; dur[v] += t1[i] - t0[i]
        if (worst / med > ww[v]) ww[v] = worst / med
      }
      printf "\nper variant: ticks, mean tick s, lost ms per tick (mean, sd), steps over 1.2x per tick, worst step / median\n"
      for (v = 1; v <= nv; ++v) {
        if (cnt[v] == 0) continue
        mu = sum[v] / cnt[v]; sd = cnt[v] > 1 ? sqrt((sq[v] - cnt[v] * mu * mu) / (cnt[v] - 1)) : 0
        printf "%-48s %3d %7.3f %9.1f %8.1f %6.2f %6.2fx\n", name[v], cnt[v], dur[v] / cnt[v], mu, sd, sl[v] / cnt[v], ww[v]
      }
    }' "$TMP/ticks" "$TMP/steps"
  exit 0
fi
echo "pos-cli under: ${PREFIX:-(nothing)}; median step $MED s; per tick: pos-cli's phases, then each step over 1.2x the median that began from the tick's start to 1 s after its end"
awk -v med="$MED" 'FNR == NR { t0[$1] = $2; t1[$1] = $3; line[$1] = $0; n = $1; next }
  { s[FNR] = $1; st[FNR] = $2; m = FNR }
  END {
    for (i = 1; i <= n; ++i) {
      split(line[i], f, " ")
      printf "tick %d: %.3f s in all; cut %.4f s (waited for a step boundary: %s, %.4f s; job stalled %.4f s, device copy %.4f s, job waits for it %d), written by %.3f s; %.2f GB\n",
             i, t1[i] - t0[i], f[4], f[11], f[12], f[5], f[6], f[10], f[7], f[8] / 1e9
      in_window = 0; slow = 0
      for (k = 1; k < m; ++k) {
        if (st[k] < t0[i] || st[k] > t1[i] + 1) continue
        ++in_window
        len = st[k + 1] - st[k]
        if (len <= 1.2 * med) continue
        ++slow
        printf "  step %5d at %+7.3f s: %.4f s (%.2fx the median)\n", s[k], st[k] - t0[i], len, len / med
      }
      printf "  %d steps began in the window, %d of them over 1.2x the median\n", in_window, slow
    }
    out = 0; out_slow = 0; worst = 0
    for (k = 61; k < m; ++k) {
      inside = 0
      for (i = 1; i <= n; ++i) if (st[k] >= t0[i] && st[k] <= t1[i] + 1) inside = 1
      if (inside) continue
      ++out; len = st[k + 1] - st[k]
      if (len > 1.2 * med) ++out_slow
      if (len > worst) worst = len
    }
    printf "outside the ticks (from step 60): %d steps, %d over 1.2x the median, the longest %.2fx\n", out, out_slow, worst / med
  }' "$TMP/ticks" "$TMP/steps"
