# What the study cost, measured by the pipeline itself: every job writes its own cost
# (its log named `cost`, a one-row benchmark file: wall, CPU and peak memory from the
# operating system's accounting, distrank._io.write_cost), read into results/<study>/
# cost.md and cost.csv (per rule, the critical path, the totals, the machine named;
# distrank.experiments.cost). Snakemake's `benchmark:` directive is not used: its
# sampling reads every job's memory maps from Snakemake's process, every 0.5 s, then every
# 30 s (default study: 37 s of its 16:24 and 69 CPU-s), and misses what happens between
# two samples (its 82 jobs: 1,375 CPU-s sampled, 1,604 CPU-s by the jobs themselves).
# Included last: its input is every target of the study, so it runs after them all.


localrules:
    cost,


# Per rule that keeps a cost file, its pattern and its log's (the job's wildcards).
COST_PATTERNS = {
    r.name: {"benchmark": str(r.log.get("cost")), "log": str(r.log[0])}
    for r in workflow.rules
    if r.log.get("cost")
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
