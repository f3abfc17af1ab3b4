#!/usr/bin/env bash
# Run the pipeline on an air-gapped GPU node from a copied checkout plus ./wheelhouse
# (see README, "Air-gapped GPU nodes"), then pack the results for the trip back.
#   scripts/offline_node_run.sh [OUTDIR] [snakemake args...]
# Uses the node's own Python (its CUDA builds of torch/cupy); installs only what is missing.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-results-packed}; shift || true
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
if ! python3 -c "import snakemake" 2>/dev/null; then
  python3 -m pip install -q --no-index --find-links wheelhouse snakemake==9.27.1 || exit 1
fi
start=$(date +%s)
python3 -m snakemake --cores all --keep-going --configfile workflow/presets/gpu.yaml "$@" \
  > "$out/snakemake.log" 2>&1
rc=$?
echo "snakemake exit $rc after $(( $(date +%s) - start )) s" | tee -a "$out/snakemake.log"
tar czf "$out/results.tgz" results .snakemake/log 2>/dev/null
tail -n 40 "$out/snakemake.log"
exit $rc
