"""distrank.experiments.cost: benchmark files parsed, the run's jobs read from Snakemake's
own records, summed per rule, and the critical path through the real DAG."""

from __future__ import annotations

import csv
import io
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from distrank.experiments import cost

SNAKEMAKE = Path(sys.executable).with_name("snakemake")

# Real benchmark files of the default study (benchmarks/default/A1.tsv, E3.tsv on a
# 2-core machine under load), and one whose job ended before Snakemake sampled it.
A1 = (
    "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    "45.12\t0:00:45\t229.51\t424.51\t157.03\t163.56\t0.00\t0.00\t8.53\t4.02\n"
)
E3 = (
    "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    "7.90\t0:00:07\t141.24\t254.65\t97.13\t100.77\t0.00\t0.22\t28.45\t2.46\n"
)
SHORT = (
    "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    "0.0123\t0:00:00\tNA\tNA\tNA\tNA\tNA\tNA\t0.00\t0.00\n"
)


def test_a_benchmark_file_gives_wall_cpu_and_peak(tmp_path):
    (tmp_path / "A1.tsv").write_text(A1)
    (tmp_path / "short.tsv").write_text(SHORT)
    assert cost.read_benchmark(tmp_path / "A1.tsv") == cost.Benchmark(45.12, 4.02, 229.51)
    short = cost.read_benchmark(tmp_path / "short.tsv")
    assert short.wall == 0.0123 and short.cpu == 0.0 and math.isnan(short.max_rss)


def test_repeats_are_averaged_and_other_files_refused(tmp_path):
    (tmp_path / "twice.tsv").write_text(A1 + E3.splitlines()[1] + "\n")
    twice = cost.read_benchmark(tmp_path / "twice.tsv")
    assert twice.wall == pytest.approx((45.12 + 7.90) / 2)
    assert twice.cpu == pytest.approx((4.02 + 2.46) / 2)
    (tmp_path / "log.tsv").write_text("a\tb\n1\t2\n")
    with pytest.raises(ValueError, match="not a benchmark file"):
        cost.read_benchmark(tmp_path / "log.tsv")


def test_a_jobs_benchmark_file_follows_from_its_log():
    patterns = {
        "score_client": {
            "benchmark": "benchmarks/d/score_client/{partition}/{client}.tsv",
            "log": "logs/d/score_client/{partition}/{client,c[0-9]+}.log",
        },
        "E1": {"benchmark": "benchmarks/d/E1.tsv", "log": "logs/d/E1.log"},
        "docs_figure": {"benchmark": "", "log": "logs/d/docs/{name}.log"},
    }
    job = cost.Job(rule="score_client", log=["logs/d/score_client/by_class/c12.log"])
    assert cost.benchmark_path(job, patterns) == "benchmarks/d/score_client/by_class/c12.tsv"
    assert cost.benchmark_path(cost.Job(rule="E1"), patterns) == "benchmarks/d/E1.tsv"
    assert (
        cost.benchmark_path(cost.Job(rule="docs_figure", log=["logs/d/docs/E1.log"]), patterns)
        is None
    )
    assert cost.benchmark_path(cost.Job(rule="unknown"), patterns) is None
    regex = cost.pattern_regex("a/{x}/{y,[0-9]{2}}/{x}.log")
    assert regex.fullmatch("a/p/12/p.log").groupdict() == {"x": "p", "y": "12"}
    assert regex.fullmatch("a/p/12/q.log") is None and regex.fullmatch("a/p/123/p.log") is None


def _job(rule, wall, inputs=(), outputs=()):
    return cost.Job(
        rule=rule,
        inputs=list(inputs),
        outputs=list(outputs),
        cost=cost.Benchmark(wall, wall / 2, 100.0),
    )


def test_the_critical_path_is_the_chain_with_the_most_wall():
    # a -> b -> d and a -> c -> d: c is longer than b; e stands alone, longer than any job
    a = _job("a", 1.0, outputs=["a.out"])
    b = _job("b", 2.0, ["a.out"], ["b.out"])
    c = _job("c", 5.0, ["a.out"], ["c.out"])
    d = _job("d", 1.5, ["b.out", "c.out", "raw.txt"], ["d.out"])
    e = _job("e", 6.0, outputs=["e.out"])
    assert [j.rule for j in cost.critical_path([a, b, c, d, e])] == ["a", "c", "d"]
    assert [j.rule for j in cost.critical_path([a, b, e])] == ["e"]
    assert cost.critical_path([]) == []


def test_records_are_grouped_into_jobs_in_dependency_order():
    records = {
        "x/out1": {"rule": "make", "job_hash": 1, "input": [], "log": ["l/make.log"],
                   "starttime": 10.0, "endtime": 12.0},
        "x/out2": {"rule": "make", "job_hash": 1, "input": [], "log": ["l/make.log"],
                   "starttime": 10.0, "endtime": 13.0},
        "y/use": {"rule": "use", "job_hash": 2, "input": ["x/out2", "raw"], "log": [],
                  "starttime": 14.0, "endtime": 20.0},
        "z/other": {"rule": "other", "job_hash": 3, "input": [], "log": [],
                    "starttime": 1.0, "endtime": 2.0},
    }  # fmt: skip
    jobs = cost.jobs_from(records, ["y/use"])
    assert [j.rule for j in jobs] == ["make", "use"]  # "other" made no target
    assert jobs[0].outputs == ["x/out1", "x/out2"] and (jobs[0].start, jobs[0].end) == (10.0, 13.0)


SNAKEFILE = """
rule all:
    input: "c.txt", "d.txt"

rule a:
    output: "a.txt"
    log: "logs/a.log"
    benchmark: "bench/a.tsv"
    shell: "sleep 0.5; echo a > {output}"

rule b:
    input: "a.txt"
    output: "{name}.txt"
    wildcard_constraints: name="b"
    log: "logs/b/{name}.log"
    benchmark: "bench/b/{name}.tsv"
    shell: "sleep 1.5; cat {input} > {output}"

rule c:
    input: "b.txt"
    output: "c.txt"
    log: "logs/c.log"
    benchmark: "bench/c.tsv"
    shell: "sleep 0.5; cat {input} > {output}"

rule d:
    output: "d.txt"
    log: "logs/d.log"
    benchmark: "bench/d.tsv"
    shell: "sleep 1; echo d > {output}"
"""
PATTERNS = {
    "a": {"benchmark": "bench/a.tsv", "log": "logs/a.log"},
    "b": {"benchmark": "bench/b/{name}.tsv", "log": "logs/b/{name}.log"},
    "c": {"benchmark": "bench/c.tsv", "log": "logs/c.log"},
    "d": {"benchmark": "bench/d.tsv", "log": "logs/d.log"},
}


@pytest.mark.slow
def test_a_real_snakemake_run_is_read_back(tmp_path, monkeypatch):
    """The installed Snakemake's records and benchmark files: four jobs, the chain
    a -> b -> c (2.5 s) longer than d (1 s) beside it."""
    (tmp_path / "Snakefile").write_text(textwrap.dedent(SNAKEFILE))
    run = subprocess.run(
        [str(SNAKEMAKE), "--cores", "2", "--quiet"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    monkeypatch.chdir(tmp_path)
    found = cost.study_cost(["c.txt", "d.txt"], PATTERNS)
    assert sorted(j.rule for j in found.jobs) == ["a", "b", "c", "d"]
    assert [j.name for j in found.path] == ["bench/a.tsv", "bench/b/b.tsv", "bench/c.tsv"]
    assert 2.5 <= found.critical < 2.5 + 3.0
    assert found.wall == pytest.approx(
        sum(cost.read_benchmark(p).wall for p in Path("bench").rglob("*.tsv"))
    )
    assert found.span >= 2.5 and not found.missing
    rows = list(csv.DictReader(io.StringIO(cost.to_csv(found))))
    assert [r["rule"] for r in rows][-1] == "total" and len(rows) == 5
    by_rule = {r["rule"]: r for r in rows}
    assert float(by_rule["b"]["wall_s"]) >= 1.5 and float(by_rule["d"]["critical_path_s"]) == 0.0
    assert float(by_rule["total"]["critical_path_s"]) == pytest.approx(found.critical, abs=0.01)
    page = cost.to_markdown(found, "tiny", "a test machine")
    assert "Measured on a test machine." in page and "| bench/b/b.tsv |" in page
    assert "4 jobs" in page
