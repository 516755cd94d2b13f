#!/usr/bin/env bash
# Snakemake runs this once after creating the conda env (--use-conda), in the working
# directory: install the distrank package there (the repository root by default).
set -euo pipefail
"$CONDA_PREFIX/bin/python" -m pip install --no-deps -e "${DISTRANK_ROOT:-$PWD}"
