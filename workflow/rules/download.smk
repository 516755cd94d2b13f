# Downloads: one job per artifact of the config's `downloads`, verified by size and
# checksum (or the lock file) before it appears under its name; archives unpack
# beside it. Shared by every study, hence outside results/<study>/.


localrules:
    download,  # compute nodes may have no internet


rule download:
    output:
        "resources/downloads/{artifact}",
    log:
        "logs/downloads/{artifact}.log",
    conda:
        "../../envs/core.yaml"
    resources:
        mem_mb=res("download", "mem_mb"),
        runtime=res("download", "runtime"),
    params:
        entry=download_entry,
        lockfile=LOCKFILE,
    script:
        "../../scripts/download.py"


rule extract_archive:
    input:
        "resources/downloads/{artifact}",
    output:
        directory("resources/downloads/{artifact}.d"),
    log:
        "logs/downloads/{artifact}.extract.log",
    conda:
        "../../envs/core.yaml"
    resources:
        mem_mb=res("extract_archive", "mem_mb"),
        runtime=res("extract_archive", "runtime"),
    script:
        "../../scripts/extract_archive.py"
