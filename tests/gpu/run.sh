#!/usr/bin/env bash
# There (GPU): stage 3 and stage 4 (transformers path) on the GPU for each smoke model.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=index,uuid,name,compute_cap,driver_version,memory.total,memory.used \
  --format=csv,noheader,nounits | tee "${OUT:-/tmp}/nvidia-smi-gpus.csv"
nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory \
  --format=csv,noheader,nounits > "${OUT:-/tmp}/nvidia-smi-apps.csv"
python3 tests/gpu/gpu_smoke.py .gpu/models/* --out "${OUT:-/tmp}/gpu-report.json"
