"""Sphinx configuration of the distrank documentation (docs/; built by tests/docs/)."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import yaml
from docutils import nodes
from docutils.parsers.rst import Directive, directives
from docutils.statemachine import StringList
from jinja2 import Environment, StrictUndefined
from sphinx.util.nodes import make_refnode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))  # the checkout's distrank, installed or not

project = "distrank"
author = "the distrank authors"
copyright = "the distrank authors, MIT licence"

# Sphinx + autodoc, not MkDocs: the package's docstrings are reStructuredText with
# ``.. math::`` blocks and ``:math:`` roles, which autodoc renders as they are.
# Pages are Markdown (MyST), like the README they came from.
extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # the docstrings' numpy sections ("Parameters", "Returns")
    "sphinx.ext.mathjax",
    # MathJax 3.2.2 (Apache-2.0) shipped inside a wheel, copied into _static/: formulas render with
    # no CDN, offline (the browser test refuses any request that leaves 127.0.0.1).
    "sphinx-mathjax-offline",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
myst_enable_extensions = ["dollarmath"]
myst_heading_anchors = 3
exclude_patterns = ["_build", "tables"]  # tables/: included by the pages that show them
root_doc = "index"

html_theme = "furo"
highlight_language = "text"  # the docstrings' literal blocks are formulas, not Python
html_title = "distrank"
html_favicon = "_static/favicon.svg"  # else the browser asks for /favicon.ico (a 404)
html_static_path = ["_static"]
html_css_files = ["distrank.css"]
html_show_sourcelink = False

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": True, "ignore-module-all": True}
# The docstrings' parameter lists are free text after "name :", not numpydoc types.
napoleon_use_param = False
napoleon_use_rtype = False
napoleon_use_ivar = True

nitpicky = True
# Types from outside the package (numpy, pandas, torch, the standard library) have no
# inventory offline; every other cross-reference must resolve.
nitpick_ignore_regex = [
    ("py:class", r"(np|numpy|pd|pandas|torch|nn|matplotlib|sklearn|scipy|PIL)\..*"),
    ("py:class", r"(collections\.abc|typing|pathlib|os|io|dataclasses)\..*"),
    ("py:class", r"(Mapping|Sequence|Iterable|Iterator|Callable|Path|Figure|Tensor|Array)"),
    ("py:.*", r"(sklearn|scipy|os|pickle|_pickle|abc|Path|pathlib)\..*"),
    ("py:class", r"(Module|Dropout|BatchNorm)"),
    ("py:.*", r"(distrank\.)?_progress\..*"),
    ("py:.*", r"(.*\.)?_[a-z_]+"),  # private helpers a docstring names: not documented
]

STUDY = yaml.safe_load((ROOT / "config.yaml").read_text())


class Caption(Directive):
    """``distrank-caption E1``: the experiment's report caption (workflow/report/E1.rst),
    rendered with the default study's config as ``snakemake --report`` renders it."""

    required_arguments = 1
    option_spec = {"class": directives.class_option}

    def run(self):
        path = ROOT / "workflow" / "report" / f"{self.arguments[0]}.rst"
        self.state.document.settings.record_dependencies.add(str(path))
        env = Environment(undefined=StrictUndefined, autoescape=False)
        text = env.from_string(path.read_text()).render(snakemake={"config": STUDY})
        box = nodes.container(classes=["distrank-caption"])
        self.state.nested_parse(StringList(text.splitlines(), str(path)), 0, box)
        return [box]


def _lookup(dotted: str):
    """The object a dotted name imports to, or None."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for part in parts[i:]:
                obj = getattr(obj, part)
        except AttributeError:
            return None
        return obj
    return None


def _by_last_name(env) -> dict[str, list[str]]:
    """Documented Python objects by the last part of their name (built once a build)."""
    objects = env.get_domain("py").objects
    if getattr(env, "_distrank_names", (None,))[0] is not objects or len(objects) != len(
        env._distrank_names[1]
    ):
        index: dict[str, list[str]] = {}
        for full in objects:
            index.setdefault(full.rsplit(".", 1)[-1], []).append(full)
        env._distrank_names = (objects, dict(objects), index)
    return env._distrank_names[2]


def resolve_reference(app, env, node, contnode):
    """What a docstring names and the Python domain did not find: a re-export
    (``distrank.metrics.score`` is ``distrank.metrics.scoring.score``), a short name
    documented once elsewhere (``lemma_bound``), or a module constant that autodoc
    lists without an entry (``RAW_MD5``: shown as code, unlinked). Anything else,
    a name that does not exist, stays a warning and fails the strict build."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip(".~")
    modname, clsname = node.get("py:module"), node.get("py:class")
    obj = None
    for dotted in (f"{modname}.{clsname}.{target}", f"{modname}.{target}", target):
        if "None" not in dotted.split(".") and (obj := _lookup(dotted)) is not None:
            break
    names = [target]
    if obj is not None and str(getattr(obj, "__module__", "")).startswith("distrank"):
        names.insert(0, f"{obj.__module__}.{getattr(obj, '__qualname__', target)}")
    index, objects = _by_last_name(env), env.get_domain("py").objects
    for name in names:
        found = [
            f for f in index.get(name.rsplit(".", 1)[-1], []) if f == name or f.endswith("." + name)
        ]
        if len(found) == 1:
            entry = objects[found[0]]
            return make_refnode(
                app.builder, node["refdoc"], entry.docname, entry.node_id, contnode, found[0]
            )
    if obj is not None and not (
        inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj)
    ):
        return contnode
    return None


def setup(app):
    app.connect("missing-reference", resolve_reference)
    app.add_directive("distrank-caption", Caption)
