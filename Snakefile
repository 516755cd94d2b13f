# Consistent distributed ranking of generative models via kernel distances.
# A table of contents: the stages live in workflow/rules/, the logic in src/distrank/.
from snakemake.utils import min_version

min_version("9.0")


# config.yaml is the default study; a --configfile on the command line replaces it.
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"
include: "workflow/rules/download.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/zoo.smk"
include: "workflow/rules/features.smk"
include: "workflow/rules/clients.smk"
include: "workflow/rules/score.smk"


# The experiments the config lists, one rules file each (distrank.experiments has
# their logic); see workflow/README.md to add one.
for _key in config["experiments"]:

    include: f"workflow/rules/experiments/{_key}.smk"


# The second study (model agreement via anchoring), when its section enables it.
if config.get("agreement", {}).get("enabled", False):

    include: "workflow/rules/agreement.smk"


# The docs' figures (docs/figures/), copied from the default and the Inception study only.
if config["study"] in ("default", "inception"):

    include: "workflow/rules/docs.smk"


check_resources()


# What the study cost (results/<study>/cost.md), from every job's benchmark file; last.
include: "workflow/rules/cost.smk"


rule all:
    default_target: True
    input:
        all_outputs(),
        STUDY_TARGETS,
        rules.cost.output,
