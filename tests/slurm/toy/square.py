"""Write i*i to the output; record the SLURM job id (if any) in the log."""

import os

i = int(snakemake.wildcards.i)
with open(snakemake.output[0], "w") as out:
    out.write(f"{i * i}\n")
with open(snakemake.log[0], "w") as log:
    log.write(f"SLURM_JOB_ID={os.environ.get('SLURM_JOB_ID', '')}\n")
    log.write(f"SLURM_CPUS_PER_TASK={os.environ.get('SLURM_CPUS_PER_TASK', '')}\n")
    log.write(f"threads={snakemake.threads}\n")
