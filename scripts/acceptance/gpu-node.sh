#!/usr/bin/env bash
# The acceptance run of gpulab on a GPU node (issues 24, 25, 27, 28): what a release must show on
# real hardware, as one script with two phases, because the GPU preset outlasts one remote call.
#
#   scripts/acceptance/gpu-node.sh start OUT [all|health|preset|recheck|quick]  # installs snakemake
#                           # from ./wheelhouse if missing, starts the whole run (or the health
#                           # sequence alone, or all but it, or two health runs against a saved
#                           # baseline, or the README's main job twice) detached
#   scripts/acceptance/gpu-node.sh poll OUT    # waits up to POLL_S (570) seconds, then packs what is
#                           # made so far into OUT/acceptance.tgz; call again until it prints DONE
# A lent machine is given back ~30 s after a call ends, with everything on it: run
# `start OUT && poll OUT` as one call and each next poll at once.
# The run: the GPU preset, then verify, export, bundle, a one-stage change, the health sequence.
#
# The health sequence: 3 healthy runs into one baseline (noise-aware), a 4th and a 5th compared
# (exit 0 expected twice in a row: a false alarm costs as much as a missed fault), a 6th with a
# foreign process (bf16 GEMMs + 1 GiB copies) on GPU0 (exit 1 expected,
# the node state names the process). Every figure comes back under OUT (no datasets).
set -uo pipefail
SELF="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
cmd=${1:?start|poll}; OUT=$(realpath -m "${2:?output folder}")
cd "$(dirname "$SELF")/../.."
PY=${PY:-python3}
SM="$PY -m snakemake"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"   # python -m gpulab from the checkout
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT"
STATE=.acceptance
mkdir -p "$STATE"

have_snakemake() { $PY -c "import snakemake" 2>/dev/null; }

health_sequence() {
  # The health sequence (issue 25), on fresh results.
  rm -rf results/probe results/transfer results/collectives results/gemm results/report
  for i in 1 2 3 4 5 6; do
    if [ "$i" = 6 ]; then
      $PY - <<'PYEOF' > "$STATE/foreign.log" 2>&1 &
import torch, time
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = a.clone()
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
t = time.time()
while time.time() - t < 600:
    for _ in range(20): a @ b
    y.copy_(x)
    torch.cuda.synchronize()
PYEOF
      FOREIGN=$!; sleep 5
    fi
    t0=$(date +%s)
    $SM health --forceall --cores all --configfile workflow/presets/health.yaml > "$STATE/health-$i.log" 2>&1
    say "health run $i rc=$? seconds=$(( $(date +%s) - t0 ))"
    case $i in
      1) $PY -m gpulab baseline save accept > "$OUT/baseline-1.txt" 2>&1 ;;
      2|3) $PY -m gpulab baseline save accept --add > "$OUT/baseline-$i.txt" 2>&1 ;;
      *) $PY -m gpulab compare accept > "$OUT/compare-$i.txt" 2>&1; say "compare run $i rc=$?" ;;
    esac
  done
  [ -n "${FOREIGN:-}" ] && kill "$FOREIGN" 2>/dev/null
  cp results/probe/*.h5 "$OUT/" 2>/dev/null
  cp baselines/accept.yaml "$OUT/" 2>/dev/null
  say "finished"; touch "$OUT/DONE"
}

recheck() {
  # Two healthy runs against a baseline saved earlier, on another lease of the machine
  # (BASELINE, default the committed one of 2026-12-04): a healthy node must read PASS twice in a row.
  mkdir -p baselines
  cp "${BASELINE:-docs/runs/2026-12-04-h200-health/accept.yaml}" baselines/accept.yaml
  rm -rf results/probe results/transfer results/collectives results/gemm results/report
  for i in 1 2; do
    t0=$(date +%s)
    $SM health --forceall --cores all --configfile workflow/presets/health.yaml > "$STATE/recheck-$i.log" 2>&1
    say "recheck run $i rc=$? seconds=$(( $(date +%s) - t0 ))"
    $PY -m gpulab compare accept > "$OUT/recheck-$i.txt" 2>&1; say "compare recheck $i rc=$?"
  done
  say "finished"; touch "$OUT/DONE"
}

verdicts() {
  # Every bar and check of every result under results/, counted per result and verdict.
  $PY - <<'PYEOF'
from gpulab import results
for f in results.find_results("results"):
    counts = {}
    for table in ("bars", "checks"):
        try:
            t = results.read_table(f, table)
        except Exception:  # noqa: BLE001 - a result without that table
            continue
        for v, n in t["verdict"].value_counts().items():
            counts[f"{table} {v}"] = int(n)
        bad = t[t["verdict"] == "fail"]
        for _, r in bad.iterrows():
            print(f"  FAIL {f}: {r.get('bar', r.get('check'))} [{r.get('case', '')}] "
                  f"{r.get('measured', r.get('value'))} {r.get('note', '')}"[:300])
    print(f, counts)
PYEOF
}

quick_twice() {
  # The README's main job (the quick preset, config.yaml) twice on fresh results: a healthy GPU
  # must end with no failed bar or check both times. QUICK_TARGETS="kernels sort": those rules only.
  nvidia-smi -L > "$OUT/gpus.txt" 2>&1
  for i in 1 2; do
    t0=$(date +%s)
    $SM --cores all --forceall ${QUICK_TARGETS:-} > "$STATE/quick-$i.log" 2>&1
    say "quick preset run $i rc=$? seconds=$(( $(date +%s) - t0 ))"
    grep -E "steps|Finished|Error" "$STATE/quick-$i.log" > "$OUT/quick-$i-progress.txt"
    verdicts > "$OUT/quick-$i-verdicts.txt" 2>&1
    mkdir -p "$OUT/results-$i"  # each result file under 20 MB, the data stage's left out
    find results -name '*.h5' -size -20M -not -path 'results/data/*' -exec cp --parents {} "$OUT/results-$i/" \;
    say "run $i: $(grep -c FAIL "$OUT/quick-$i-verdicts.txt") failed bars/checks"
  done
  cp results/report/report.html "$OUT/" 2>/dev/null
  say "finished"; touch "$OUT/DONE"
}

case "$cmd" in
start)
  have_snakemake || $PY -m gpulab.wheelhouse install --src wheelhouse >"$STATE/pip.log" 2>&1 \
      || { tail "$STATE/pip.log"; exit 1; }
  rm -rf "$STATE/out" && mkdir -p "$STATE/out"
  setsid nohup "$SELF" "run-${3:-all}" "$PWD/$STATE/out" >"$STATE/run-all.log" 2>&1 < /dev/null &
  echo "started (progress: $STATE/out/progress.txt)"
  ;;
poll)
  end=$(( $(date +%s) + ${POLL_S:-570} ))
  while [ "$(date +%s)" -lt "$end" ] && [ ! -f "$STATE/out/DONE" ]; do sleep 15; done
  # One archive: the device tool brings back a handful of files per call, and an idle machine is
  # given back within seconds, so a second call to fetch the rest finds nothing.
  tar czf "$OUT/acceptance.tgz" -C "$STATE" out $(cd "$STATE" && ls *.log 2>/dev/null)
  tail -5 "$STATE/out/progress.txt" 2>/dev/null
  [ -f "$STATE/out/DONE" ] && echo DONE || echo "still running"
  ;;
run-all|run-health|run-preset|run-recheck|run-quick)
  say() { echo "$(date -u +%H:%M:%S) $*" >> "$OUT/progress.txt"; }
  [ "$cmd" = run-quick ] && { quick_twice; exit; }
  [ "$cmd" = run-health ] && { health_sequence; exit; }
  [ "$cmd" = run-recheck ] && { recheck; exit; }
  nvidia-smi -L > "$OUT/gpus.txt" 2>&1
  say "GPU preset started"
  t0=$(date +%s)
  $SM --cores all --configfile workflow/presets/gpu.yaml > "$STATE/gpu-preset.log" 2>&1
  say "GPU preset rc=$? seconds=$(( $(date +%s) - t0 ))"
  grep -E "steps|Finished|Error" "$STATE/gpu-preset.log" > "$OUT/gpu-preset-progress.txt"
  tail -200 "$STATE/gpu-preset.log" > "$OUT/gpu-preset-tail.log"
  $PY -m gpulab verify --results-dir results > "$OUT/verify.txt" 2>&1; say "verify rc=$?"
  $PY -m gpulab export --results-dir results --out "$OUT/export/results" > "$OUT/export.log" 2>&1
  say "export rc=$?"
  $PY -m gpulab export --format prom --results-dir results --out "$OUT/export/gpulab" \
    >> "$OUT/export.log" 2>&1; say "prom rc=$?"
  $PY -m gpulab bundle "$STATE/bundle.tar.gz" > "$OUT/bundle.log" 2>&1 \
    && $PY -m gpulab bundle "$STATE/bundle.tar.gz" --verify >> "$OUT/bundle.log" 2>&1
  say "bundle+verify rc=$? bytes=$(stat -c %s "$STATE/bundle.tar.gz" 2>/dev/null)"
  cp results/report/report.html "$OUT/" 2>/dev/null
  # A one-stage config change (the probe, 1 GPU instead of all; a value the preset does not set):
  # only that stage, its chapter and the assembly rerun (issue 28).
  $SM --cores all --configfile workflow/presets/gpu.yaml --config 'probe={"gpus": 1}' -n \
    > "$OUT/one-stage-dry-run.txt" 2>&1
  t0=$(date +%s)
  $SM --cores all --configfile workflow/presets/gpu.yaml --config 'probe={"gpus": 1}' \
    > "$STATE/one-stage.log" 2>&1
  say "one-stage rerun rc=$? seconds=$(( $(date +%s) - t0 ))"
  if [ "$cmd" = run-all ]; then health_sequence; else say "finished"; touch "$OUT/DONE"; fi
  ;;
*) echo "usage: $0 start|poll OUT" >&2; exit 2 ;;
esac
