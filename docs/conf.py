"""Sphinx configuration of the distrank documentation (docs/; built by tests/docs/)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml
from docutils import nodes
from docutils.parsers.rst import Directive, directives
from docutils.statemachine import StringList
from jinja2 import Environment, StrictUndefined

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
    ("py:.*", r"(.*\.)?_[a-z_]+(\..*)?"),  # private names and modules: not documented
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


def setup(app):
    app.add_directive("distrank-caption", Caption)
