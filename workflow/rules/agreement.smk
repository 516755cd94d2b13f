# The second study: model agreement via anchoring (distrank.agreement), families
# A1-A6, one job each; included by the Snakefile when agreement.enabled is true.
from distrank.agreement import FAMILIES as AGREEMENT_FAMILIES

AGREEMENT = config["agreement"]
AGREEMENT_TARGETS = []

for _family, _stem in AGREEMENT_FAMILIES.items():
    if not AGREEMENT[_family]["enabled"]:
        continue
    _key = _stem.split("_", 1)[0]  # A1, ..., A6: the rule, its resources and caption

    rule:
        name:
            _key
        output:
            tables=multiext(f"{RESULTS}/{_stem}", ".csv", ".md", ".tex"),
            pairs=f"{RESULTS}/{_stem}_pairs.csv",
            pdf=f"{FIGURES}/{_stem}.pdf",
            png=report(
                f"{FIGURES}/{_stem}.png", caption=f"../report/{_key}.rst", category="Agreement"
            ),
        log:
            f"{LOGS}/{_key}.log",
            cost=f"{BENCH}/{_key}.tsv",
        conda:
            "../../envs/core.yaml"
        threads: res(_key, "threads")
        resources:
            mem_mb=res(_key, "mem_mb"),
            runtime=res(_key, "runtime"),
        params:
            family=_family,
            settings=AGREEMENT[_family],
            seed=config["seed"],
        script:
            "../../scripts/agreement.py"

    AGREEMENT_TARGETS += [
        *multiext(f"{RESULTS}/{_stem}", ".csv", ".md", ".tex", "_pairs.csv"),
        *multiext(f"{FIGURES}/{_stem}", ".pdf", ".png"),
    ]


STUDY_TARGETS += AGREEMENT_TARGETS


# `snakemake agreement` runs this study alone.
rule agreement:
    input:
        AGREEMENT_TARGETS,
