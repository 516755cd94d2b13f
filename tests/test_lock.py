"""The installed environment is the lock: every distribution at its locked version, none
missing, none extra. A drifted venv (a hand-installed package, an upgrade) is named here
instead of silently changing results; `./setup.sh --test` restores it."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

import pytest

LOCK = Path(__file__).resolve().parents[1] / "requirements.lock"
PYPROJECT = LOCK.with_name("pyproject.toml")


def canonical(name: str) -> str:
    """PEP 503 normalised name: runs of -, _ and . are one -, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def locked() -> dict[str, str]:
    pins = {}
    for number, line in enumerate(LOCK.read_text().splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)", line)
        assert match, f"{LOCK.name}:{number}: expected NAME==VERSION, got {line!r}"
        pins[canonical(match[1])] = match[2]
    return pins


def installed() -> dict[str, str]:
    found = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions()}
    found.pop("distrank", None)  # the project itself, installed editable
    return found


def test_installed_distributions_equal_the_lock():
    want, have = locked(), installed()
    missing = sorted(f"{n}=={v}" for n, v in want.items() if n not in have)
    extra = sorted(f"{n}=={v}" for n, v in have.items() if n not in want)
    drifted = sorted(
        f"{n}: installed {have[n]}, locked {v}"
        for n, v in want.items()
        if n in have and have[n] != v
    )
    assert not (missing or extra or drifted), (
        f"the venv differs from {LOCK.name} (run ./setup.sh --test): "
        f"missing {missing}, not in the lock {extra}, other versions {drifted}"
    )


def test_every_dependency_of_pyproject_is_locked():
    """A dependency added to pyproject.toml without refreshing the lock is named."""
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    names = {canonical(re.match(r"[A-Za-z0-9._-]+", s)[0]) for s in specs}
    names.discard("distrank")
    assert sorted(names - set(locked())) == []


#: conda-forge names of distributions that PyPI names otherwise.
CONDA_NAMES = {"pytorch": "torch", "matplotlib-base": "matplotlib"}


@pytest.mark.parametrize("env", ["core.yaml", "torch.yaml"])
def test_conda_envs_pin_the_locked_versions(env):
    """envs/ cannot be resolved here (no conda channel); their pins follow the lock."""
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load((LOCK.parent / "envs" / env).read_text())
    pins = []
    for entry in spec["dependencies"]:
        pins += entry["pip"] if isinstance(entry, dict) else [entry]
    versions = {}
    for pin in pins:
        name, _, version = (p.strip() for p in pin.partition("=="))
        if version:
            versions[canonical(CONDA_NAMES.get(name, name))] = version
    assert len(versions) >= 10
    lock = locked()
    assert {n: lock.get(n) for n in versions} == versions
