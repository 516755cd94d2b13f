# The figures the docs and the README show: the default study's PNGs in docs/figures/,
# the Inception study's (configs/inception.yaml) in docs/figures/inception/, copied and
# committed; tests/docs/test_docs_figures.py checks they are current. The Inception study
# also compares its E1 and E6 rankings with the default study's (docs/tables/).
# Included by the Snakefile for these two studies only.
from pathlib import Path

DOCS_FIGURES_DIR = {"default": "docs/figures", "inception": "docs/figures/inception"}[STUDY]
DOCS_FIGURES = sorted(Path(p).stem for p in [*all_outputs(), *STUDY_TARGETS] if p.endswith(".png"))


localrules:
    docs_figure,


rule docs_figure:
    input:
        f"{FIGURES}/{{name}}.png",
    output:
        f"{DOCS_FIGURES_DIR}/{{name}}.png",
    log:
        f"{LOGS}/docs/{{name}}.log",
    wildcard_constraints:
        name=one_of(DOCS_FIGURES),
    conda:
        "../../envs/core.yaml"
    # a shell command runs in Snakemake's own process; a run: block would spawn a second
    # Snakemake per figure, which parses the workflow again (1.4 CPU-s each)
    shell:
        "cp {input:q} {output:q}.tmp 2> {log:q} && mv {output:q}.tmp {output:q}"


STUDY_TARGETS += expand(f"{DOCS_FIGURES_DIR}/{{name}}.png", name=DOCS_FIGURES)

if STUDY == "inception":
    # the default study's tables: made by its own run, which must come first
    ACROSS_STEMS = ["E1_kd_consistency", "E6_prdc"]
    ACROSS_DEFAULT = [f"results/default/{stem}.csv" for stem in ACROSS_STEMS]

    rule e1_across_networks:
        input:
            default=ACROSS_DEFAULT,
            study=[f"{RESULTS}/{stem}.csv" for stem in ACROSS_STEMS],
        output:
            multiext("docs/tables/E1_across_networks", ".csv", ".md", ".tex"),
        log:
            f"{LOGS}/docs/E1_across_networks.log",
        conda:
            "../../envs/core.yaml"
        params:
            extractors=("efficientnet_lite0", config["features"]["extractor"]),
        script:
            "../../scripts/across_networks.py"

    if all(Path(p).is_file() for p in ACROSS_DEFAULT):
        STUDY_TARGETS += rules.e1_across_networks.output
    else:
        logger.warning(
            "docs/tables/E1_across_networks: run the default study first (its "
            f"{', '.join(ACROSS_DEFAULT)}) to compare the two networks' rankings"
        )
