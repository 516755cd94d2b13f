# The figures the docs and the README show: the default study's PNGs, copied into
# docs/figures/ and committed; tests/docs/test_docs_figures.py checks they are current.
# Included by the Snakefile for the default study only.
import shutil
from pathlib import Path

from distrank._io import atomic_path

DOCS_FIGURES = sorted(Path(p).stem for p in [*all_outputs(), *STUDY_TARGETS] if p.endswith(".png"))


localrules:
    docs_figure,


rule docs_figure:
    input:
        f"{FIGURES}/{{name}}.png",
    output:
        "docs/figures/{name}.png",
    log:
        f"{LOGS}/docs/{{name}}.log",
    wildcard_constraints:
        name=one_of(DOCS_FIGURES),
    run:
        with atomic_path(output[0]) as tmp:
            shutil.copyfile(input[0], tmp)


STUDY_TARGETS += expand("docs/figures/{name}.png", name=DOCS_FIGURES)
