#!/usr/bin/env bash
# Here (CPU): make the three smoke models into .gpu/models for the GPU machine.
set -euo pipefail
cd "$(dirname "$0")/../.."
grep -qx '/.gpu/' .git/info/exclude || echo '/.gpu/' >> .git/info/exclude
for scheme in NVFP4 NVFP4A16 FP8-ATTN+NVFP4-MLP; do
  HF_HUB_OFFLINE=1 .venv/bin/python -m imgbuild.smokemodel ".gpu/models/$scheme" --scheme "$scheme" --force
done
du -sh .gpu/models/*
