"""The upstream code that a published generator checkpoint needs, pinned and importable.

StyleGAN2-ADA's and EDM's network pickles hold the networks as Python objects whose
classes live in the upstream repositories (``dnnlib``, ``torch_utils``,
``training``). Each repository is pinned to one commit (:class:`Upstream`,
``UPSTREAMS``): a GitHub archive that the pipeline downloads and extracts like
any other artifact. :func:`upstream_code` makes one extracted tree importable inside
a ``with`` block only, so that two trees with the same module names (both have
``dnnlib``) never mix; :mod:`distrank.zoo.checkpoints` loads and samples the
networks inside it.

StyleGAN2-ADA's CUDA ops (``torch_utils/custom_ops.py``) import the plugin they
built by name, which fails under torch 2.x (``torch.utils.cpp_extension.load`` no
longer registers it in ``sys.modules``), so upstream silently falls back to its
slow reference ops. :func:`upstream_code` patches ``get_plugin`` in memory (the
downloaded tree is not edited) to use the module that ``load`` returns, as
StyleGAN3 does; :data:`PLUGINS` records the plugins loaded that way.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "EDM",
    "PLUGINS",
    "STYLEGAN2_ADA",
    "UPSTREAMS",
    "Upstream",
    "find_code_root",
    "upstream_code",
]


@dataclass(frozen=True)
class Upstream:
    """A GitHub repository pinned to one commit."""

    repo: str  # owner/name
    commit: str  # 40 hex digits

    @property
    def archive_url(self) -> str:
        """GitHub's tarball of the commit; it unpacks to ``<name>-<commit>/``."""
        return f"https://github.com/{self.repo}/archive/{self.commit}.tar.gz"

    @property
    def top_folder(self) -> str:
        return f"{self.repo.split('/')[1]}-{self.commit}"


# Head of each repository's main branch. No checksum is published for GitHub's
# archives (and they are generated on demand), so the pipeline records their
# sha256 on first download in resources/checksums.lock.
STYLEGAN2_ADA = Upstream("NVlabs/stylegan2-ada-pytorch", "6f160b3d22b8b178ebe533a50d4d5e63aedba21d")
EDM = Upstream("NVlabs/edm", "008a4e5316c8e3bfe61a62f874bddba254295afb")
UPSTREAMS = {"stylegan2_ada": STYLEGAN2_ADA, "edm": EDM}


#: Names of the CUDA plugins that the patched ``get_plugin`` loaded in this process
#: (``bias_act_plugin``, ``upfirdn2d_plugin``): evidence that the fast ops ran.
PLUGINS: set[str] = set()


def find_code_root(code_dir: str | os.PathLike) -> Path:
    """The upstream source tree: ``code_dir`` or its single subfolder holding ``dnnlib/``."""
    code_dir = Path(code_dir)
    if (code_dir / "dnnlib").is_dir():
        return code_dir
    if not code_dir.is_dir():
        raise NotADirectoryError(f"upstream code directory {code_dir} does not exist")
    children = [c for c in code_dir.iterdir() if c.is_dir() and not c.name.startswith(".")]
    if len(children) == 1 and (children[0] / "dnnlib").is_dir():
        return children[0]
    raise FileNotFoundError(
        f"{code_dir} is not an upstream source tree: expected dnnlib/ in it or in its single "
        f"subfolder (GitHub's archive unpacks to <repo>-<commit>/); found "
        f"{sorted(c.name for c in children) or 'no folders'}"
    )


@contextlib.contextmanager
def upstream_code(code_root: str | os.PathLike):
    """Make the modules of ``code_root`` importable inside the block, and only there.

    ``code_root`` goes first on ``sys.path``. Modules of the same names imported
    before (e.g. another repository's ``dnnlib``) are set aside so that this
    tree's are used, and put back afterwards. On exit, every module imported
    from ``code_root`` is dropped from ``sys.modules`` again, so the next tree
    (EDM's after StyleGAN2-ADA's: both have ``dnnlib``, ``torch_utils`` and
    ``training``) imports its own; so are the modules that
    ``torch_utils.persistence`` makes from source embedded in a pickle
    (``_imported_module_<hex>``) and the CUDA plugins built inside the block.

    A tree with ``torch_utils/custom_ops.py`` (StyleGAN2-ADA) gets its
    ``get_plugin`` patched in memory so that built CUDA plugins load under
    torch 2.x (see the module doc); the files are not touched.
    """
    code_root = Path(code_root).resolve()
    names = {
        p.stem if p.suffix == ".py" else p.name
        for p in code_root.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").is_file()
    }
    before = set(sys.modules)
    shadowed = {
        name: module for name, module in sys.modules.items() if name.partition(".")[0] in names
    }
    for name in shadowed:
        del sys.modules[name]
    saved_path = list(sys.path)
    sys.path.insert(0, str(code_root))
    plugins: set[str] = set()
    try:
        _patch_custom_ops(code_root, plugins)
        yield code_root
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - before:
            if (
                name.partition(".")[0] in names
                or name.startswith(PERSISTENCE_PREFIX)
                or name in plugins
                or _inside(sys.modules[name], code_root)
            ):
                del sys.modules[name]
        sys.modules.update(shadowed)


#: Prefix of the modules that upstream's torch_utils.persistence creates with exec().
PERSISTENCE_PREFIX = "_imported_module_"


def _patch_custom_ops(code_root: Path, plugins: set[str]) -> None:
    """Make ``torch_utils.custom_ops.get_plugin`` of ``code_root`` return the module
    that ``torch.utils.cpp_extension.load`` returns (StyleGAN3's fix of upstream
    issues #34, #39, #97): ``load`` is wrapped, during ``get_plugin`` only, so that it
    also registers the module in ``sys.modules`` under its name, where upstream's
    ``importlib.import_module(module_name)`` then finds it."""
    if not (code_root / "torch_utils" / "custom_ops.py").is_file():
        return
    import importlib

    custom_ops = importlib.import_module("torch_utils.custom_ops")
    original = custom_ops.get_plugin
    if getattr(original, "distrank_patched", False):
        return

    def get_plugin(module_name, *args, **kwargs):
        import torch.utils.cpp_extension as cpp_extension

        load = cpp_extension.load

        def load_and_register(*load_args, **load_kwargs):
            module = load(*load_args, **load_kwargs)
            name = load_kwargs.get("name", load_args[0] if load_args else module_name)
            sys.modules[name] = module
            plugins.add(name)
            PLUGINS.add(name)
            return module

        cpp_extension.load = load_and_register
        try:
            return original(module_name, *args, **kwargs)
        finally:
            cpp_extension.load = load

    get_plugin.distrank_patched = True
    custom_ops.get_plugin = get_plugin


def _inside(module, root: Path) -> bool:
    file = getattr(module, "__file__", None)
    return bool(file) and root in Path(file).resolve().parents
