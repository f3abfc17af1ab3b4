#!/usr/bin/env bash
# The single-device harness-overhead check at the quick preset's warmup 1 / repeats 3 on a GPU:
# ABBA blocks with the median over blocks (gpulab.gemm.single.harness_check) 8 times, then the
# GEMM stage as `make run` runs it, 3 times (each its own process, as in the pipeline).
set -uo pipefail
export PYTHONPATH="$PWD/src" NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
PY=${PY:-python3}
$PY - > "$OUT/harness.txt" 2>&1 <<'PYEOF'
import time, torch
from gpulab.gemm import single
dev = torch.device("cuda", 0)
for i in range(8):
    t0 = time.perf_counter()
    c = single.harness_check(dev, 8192, 1, 3, i)
    print(f"try {i}: value {c.value:+.4f} bound {c.bound} {c.verdict} ({time.perf_counter() - t0:.2f} s)")
print(c.note)
PYEOF
CFG=$($PY -c 'import json,yaml; print(json.dumps({"stage": yaml.safe_load(open("config.yaml"))["gemm"], "devices": {}}))')
for i in 1 2 3; do
  $PY scripts/gemm.py --config-json "$CFG" --out "$OUT/gemm-$i.h5" > "$OUT/gemm-$i.txt" 2>&1
  echo "gemm run $i rc=$?" >> "$OUT/gemm.txt"
  $PY -c "
from gpulab import results; import sys
c = results.read_table(sys.argv[1], 'checks'); print(dict(c['verdict'].value_counts()))
print(c[c.check.str.startswith('harness')][['case','value','bound','verdict']].to_string())" "$OUT/gemm-$i.h5" >> "$OUT/gemm.txt" 2>&1
done
