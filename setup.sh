#!/usr/bin/env bash
# Idempotent set-up: the virtual environment at .venv/ with distrank installed,
# and the offline Fashion-MNIST files from Debian when we may install them.
#   ./setup.sh          everything the pipeline needs
#   ./setup.sh --test   plus the test dependencies, a local SLURM and headless chromium
#                       for the report page tests (Debian packages: root only)
set -euo pipefail
cd "$(dirname "$0")"

extra=pipeline
debs=(dataset-fashion-mnist)
if [[ "${1:-}" == "--test" ]]; then
  extra=test
  debs+=(munge slurm-wlm slurmctld slurmd slurm-client chromium)
fi

# Debian packages: only as root, only what is missing.
if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
  missing=()
  for p in "${debs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
fi

[[ -x .venv/bin/python ]] || python3 -m venv .venv
stamp=.venv/.distrank-$extra-$(sha256sum pyproject.toml | cut -c1-16)
if [[ ! -e $stamp ]]; then
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e ".[$extra]"
  touch "$stamp"
fi
