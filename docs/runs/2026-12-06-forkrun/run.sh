#!/usr/bin/env bash
# gpulab.forkrun on a GPU (issue 26): ranks forked from one process that imported torch must
# initialise CUDA and NCCL on their own; the stages that launch ranks must verify as under torchrun;
# a rank that dies must be named; and the launch overhead of forkrun vs torchrun, measured.
# Run from the repository root with OUT set:  OUT=/some/dir bash docs/runs/2026-12-06-forkrun/run.sh
set -uo pipefail
export PYTHONPATH="$PWD/src:$PWD/tests/fixtures/launch" NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
PY=${PY:-python3}
nvidia-smi -L > "$OUT/gpu.txt" 2>&1
$PY -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch.version.cuda)" >> "$OUT/gpu.txt"

$PY - > "$OUT/launch.txt" 2>&1 <<'PYEOF'
import json, statistics, subprocess, sys, tempfile, time
from pathlib import Path
import torch
from gpulab import launch
n = torch.cuda.device_count() or 2  # on a host without GPUs: 2 gloo ranks (a dry run of this script)
be = "nccl" if torch.cuda.is_available() else "gloo"
r = launch.run_workers("gpulab.launch_check", {"numel": 1 << 20}, nproc=n)
print("forkrun launch_check:", list(r), r.placement)
assert all(x["ok"] and x["backend"] == be for x in r), r
try:
    launch.run_workers("kill_rank", {"kill_rank": n - 1, "marker": "gpu-marker"}, nproc=n, timeout=300)
except launch.LaunchError as e:
    print("kill_rank named:", str(e).splitlines()[0])
# launch overhead: the same one-rank launch_check, forkrun vs torchrun (wall, 5 each, after one warm-up)
def timed(cmd_of):
    out = []
    for i in range(6):
        with tempfile.TemporaryDirectory() as d:
            Path(d, "payload.json").write_text(json.dumps({"numel": 1 << 20}))
            cmd = cmd_of(["--payload", f"{d}/payload.json", "--out-dir", d], d)
            t = time.perf_counter(); subprocess.run(cmd, check=True, capture_output=True)
            if i: out.append(time.perf_counter() - t)
    return out
fk = timed(lambda a, d: launch.forkrun_cmd("gpulab.launch_check", a, n, f"{d}/logs"))
tr = timed(lambda a, d: launch.torchrun_cmd("gpulab.launch_check", a, n))
for name, xs in (("forkrun", fk), ("torchrun", tr)):
    print(f"{name} nproc={n}: median {statistics.median(xs):.2f} s, min {min(xs):.2f}, max {max(xs):.2f} (wall, 5 launches)")
PYEOF

mkdir -p "$OUT/stages"
$PY - > "$OUT/stages.txt" 2>&1 <<'PYEOF'
import json, os, subprocess, sys, time, yaml
import numpy as np
from gpulab.data.api import write_training_set
cfg = yaml.safe_load(open("config.yaml"))
out = os.environ["OUT"] + "/stages"
rng = np.random.default_rng(0)
write_training_set("/tmp/digits.h5", rng.random((512, 1, 8, 8), dtype=np.float32), rng.integers(0, 10, 512))
for stage, variant, extra in [("collectives", "default", []), ("gemm", "main", []),
                              ("train", "ddp", ["--data", "/tmp/digits.h5"]),
                              ("train", "tensor", ["--data", "/tmp/digits.h5"])]:
    payload = json.dumps({"stage": cfg.get(stage, {}), "devices": {}})
    t = time.perf_counter()
    p = subprocess.run([sys.executable, f"scripts/{stage}.py", "--config-json", payload, "--variant",
                        variant, "--out", f"{out}/{stage}-{variant}.h5", *extra], capture_output=True, text=True)
    print(f"== {stage} {variant}: rc={p.returncode} {time.perf_counter() - t:.1f} s")
    print(p.stderr[-2500:])
PYEOF
$PY - >> "$OUT/stages.txt" 2>&1 <<'PYEOF'
import os, glob
from gpulab import results
for f in sorted(glob.glob(os.environ["OUT"] + "/stages/*.h5")):
    try:
        c = results.read_table(f, "checks")
        print(f, "checks:", dict(c["verdict"].value_counts()))
    except Exception as e:
        print(f, "no checks table:", e)
PYEOF
ls -la "$OUT/stages"
