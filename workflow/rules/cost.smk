# What the study cost, measured by the pipeline itself: every job's benchmark file
# read into results/<study>/cost.md and cost.csv (per rule wall, CPU and peak memory,
# the critical path, the totals, the machine named; distrank.experiments.cost).
# Included last: its input is every target of the study, so it runs after them all.


localrules:
    cost,


# Per rule that keeps a benchmark file, its pattern and its log's (the job's wildcards).
COST_PATTERNS = {
    r.name: {"benchmark": str(r.benchmark), "log": str(r.log[0]) if r.log else ""}
    for r in workflow.rules
    if r.benchmark
}
COST_TARGETS = [*all_outputs(), *STUDY_TARGETS]


rule cost:
    input:
        COST_TARGETS,
    output:
        md=f"{RESULTS}/cost.md",
        csv=f"{RESULTS}/cost.csv",
    log:
        f"{LOGS}/cost.log",
    conda:
        "../../envs/core.yaml"
    params:
        study=STUDY,
        patterns=COST_PATTERNS,
    script:
        "../../scripts/cost.py"
