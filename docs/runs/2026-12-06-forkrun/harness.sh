#!/usr/bin/env bash
# The single-device harness-overhead check at the quick preset's warmup 1 / repeats 3 on a GPU:
# the ABBA order (gpulab.gemm.single.harness_order) against the old order (path first in each of
# 3 rounds), alternately 4 times each; then the GEMM stage as `make run` runs it.
set -uo pipefail
export PYTHONPATH="$PWD/src" NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
PY=${PY:-python3}
$PY - > "$OUT/harness.txt" 2>&1 <<'PYEOF'
import torch
from gpulab.gemm import single
dev = torch.device("cuda", 0)
abba = single.harness_order
for i in range(4):
    for name, order in (("abba", abba), ("path-first", lambda: ["path", "plain"] * 3)):
        single.harness_order = order
        c = single.harness_check(dev, 8192, 1, 3, i)
        print(f"{name:10s} try {i}: value {c.value:+.4f} bound {c.bound} {c.verdict}")
PYEOF
$PY scripts/gemm.py --config-json "$($PY -c 'import json,yaml; print(json.dumps({"stage": yaml.safe_load(open("config.yaml"))["gemm"], "devices": {}}))')" \
  --out "$OUT/gemm-main.h5" > "$OUT/gemm.txt" 2>&1; echo "gemm rc=$?" >> "$OUT/gemm.txt"
$PY -c "
from gpulab import results; import sys
c = results.read_table(sys.argv[1], 'checks'); print(dict(c['verdict'].value_counts()))
print(c[c.check.str.startswith('harness')][['case','value','bound','verdict']].to_string())" "$OUT/gemm-main.h5" >> "$OUT/gemm.txt" 2>&1
