"""What a study cost, measured by the pipeline itself (the rule ``cost``,
``workflow/rules/cost.smk``): every job's benchmark file read, its wall,
CPU and peak memory summed per rule, the critical path (the chain of jobs, each
needing the one before, whose walls sum to the most) and the whole run's span,
written as ``results/<study>/cost.md`` and ``cost.csv`` with the machine named.

The jobs and what each read come from Snakemake's own records of the run
(``.snakemake/metadata/``: per output file its rule, inputs, log, start and end),
the costs from the benchmark files (``benchmarks/<study>/...``: each job writes its
own, ``distrank._io.write_cost``, in the columns of Snakemake's). Standard library
only: the job starts in a fraction of a second.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import math
import os
import platform
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: The columns of a benchmark file (a job's own or Snakemake's) that the cost reads.
BENCHMARK_COLUMNS = ("s", "max_rss", "cpu_time")


@dataclass(frozen=True)
class Benchmark:
    """One job's benchmark file: wall seconds, CPU seconds (user + system of the job's
    processes), peak resident memory in MB (``nan`` where Snakemake's sampling missed a
    short job)."""

    wall: float
    cpu: float
    max_rss: float


@dataclass
class Job:
    """One job of the run: its rule, the files it wrote and read, its log and timing."""

    rule: str
    outputs: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    start: float = math.nan
    end: float = math.nan
    benchmark: str | None = None
    cost: Benchmark | None = None

    @property
    def wall(self) -> float:
        return self.cost.wall if self.cost else 0.0

    @property
    def name(self) -> str:
        """Its benchmark file's name (where a reader finds the job), else its rule."""
        return self.benchmark or self.rule


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:  # "NA": a job too short for Snakemake to sample its memory
        return math.nan


def read_benchmark(path: str | os.PathLike) -> Benchmark:
    """A benchmark file, a job's own or Snakemake's (tab-separated, a header and one row
    per repeat; the mean over repeats)."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    if not rows or any(c not in rows[0] for c in BENCHMARK_COLUMNS):
        raise ValueError(f"{path}: not a benchmark file (columns {BENCHMARK_COLUMNS})")
    values = {c: [_number(r[c]) for r in rows] for c in BENCHMARK_COLUMNS}
    wall, max_rss, cpu = (sum(v) / len(v) for v in values.values())
    return Benchmark(wall=wall, cpu=cpu, max_rss=max_rss)


def read_records(metadata: str | os.PathLike) -> dict[str, dict]:
    """Snakemake's metadata records (its file backend, ``.snakemake/metadata``) by
    output path: a record's file name is the path, urlsafe-base64 encoded, cut into
    pieces of at most NAME_MAX characters (all but the last prefixed ``@``)."""
    records: dict[str, dict] = {}
    root = Path(metadata)
    for folder, _, names in os.walk(root):
        parts = [p.removeprefix("@") for p in Path(folder).relative_to(root).parts]
        for name in names:
            try:
                path = base64.urlsafe_b64decode("".join([*parts, name])).decode()
                with open(Path(folder) / name) as handle:
                    record = json.load(handle)
            except (ValueError, UnicodeDecodeError, OSError):
                continue  # not a record
            if isinstance(record, dict) and record.get("rule") and not record.get("incomplete"):
                records[path] = record
    return records


def pattern_regex(pattern: str):
    """A Snakemake file pattern (``{name}`` or ``{name,regex}`` wildcards) as a compiled
    regex with one named group per wildcard."""
    out, seen, last = [], set(), 0
    for match in re.finditer(r"\{\s*(\w+)\s*(?:,\s*((?:[^{}]|\{[^{}]*\})+))?\}", pattern):
        out.append(re.escape(pattern[last : match.start()]))
        name, regex = match[1], match[2] or ".+"
        out.append(f"(?P={name})" if name in seen else f"(?P<{name}>{regex})")
        seen.add(name)
        last = match.end()
    out.append(re.escape(pattern[last:]))
    return re.compile("".join(out))


def fill(pattern: str, wildcards: Mapping[str, str]) -> str:
    """``pattern`` with its wildcards (constraints dropped) replaced by ``wildcards``."""
    return re.sub(
        r"\{\s*(\w+)\s*(?:,\s*(?:[^{}]|\{[^{}]*\})+)?\}", lambda m: wildcards[m[1]], pattern
    )


def benchmark_path(job: Job, patterns: Mapping[str, Mapping[str, str]]) -> str | None:
    """The benchmark file of ``job``: its rule's benchmark pattern (``patterns[rule]``:
    ``benchmark`` and ``log``), the wildcards read from the job's log file."""
    rule = patterns.get(job.rule)
    if not rule or not rule.get("benchmark"):
        return None
    if "{" not in rule["benchmark"]:
        return rule["benchmark"]
    regex = pattern_regex(rule.get("log") or "")
    for log in job.log:
        match = regex.fullmatch(log)
        if match:
            return fill(rule["benchmark"], match.groupdict())
    return None


def jobs_from(records: Mapping[str, Mapping], targets: Iterable[str]) -> list[Job]:
    """The jobs that made ``targets``, and the jobs before them: records grouped into
    jobs (one job writes its outputs' records with one hash), followed upstream
    through their inputs. Sorted so that every job comes after those it read from."""
    by_job: dict[tuple, Job] = {}
    producer: dict[str, tuple] = {}
    for path, record in sorted(records.items()):
        key = (record["rule"], record.get("job_hash"), tuple(record.get("log") or ()))
        job = by_job.setdefault(
            key,
            Job(
                rule=record["rule"],
                inputs=list(record.get("input") or []),
                log=list(record.get("log") or []),
                start=float(record.get("starttime") or math.nan),
            ),
        )
        job.outputs.append(path)
        job.end = max(float(record.get("endtime") or math.nan), job.end, key=_nan_low)
        producer[path] = key
    order: list[tuple] = []
    state: dict[tuple, int] = {}  # 1 visiting, 2 done

    def visit(key: tuple) -> None:  # iterative: a long chain must not hit the recursion limit
        stack = [(key, iter(_upstream(by_job[key], producer)))]
        state[key] = 1
        while stack:
            current, pending = stack[-1]
            for nxt in pending:
                if state.get(nxt) is None:
                    state[nxt] = 1
                    stack.append((nxt, iter(_upstream(by_job[nxt], producer))))
                    break
            else:
                stack.pop()
                state[current] = 2
                order.append(current)

    for target in targets:
        if target in producer and state.get(producer[target]) is None:
            visit(producer[target])
    return [by_job[k] for k in order]


def _nan_low(x: float) -> float:
    return -math.inf if math.isnan(x) else x


def _upstream(job: Job, producer: Mapping[str, tuple]) -> list[tuple]:
    own = {producer.get(o) for o in job.outputs}
    return list(
        dict.fromkeys(producer[i] for i in job.inputs if i in producer and producer[i] not in own)
    )


def critical_path(jobs: list[Job], producer_of: Mapping[str, Job] | None = None) -> list[Job]:
    """The chain of jobs, each reading an output of the one before, whose walls sum to
    the most (``jobs`` in dependency order, as :func:`jobs_from` gives them)."""
    producer_of = producer_of or {o: j for j in jobs for o in j.outputs}
    best: dict[int, tuple[float, Job | None]] = {}
    for job in jobs:
        before = [
            producer_of[i] for i in job.inputs if i in producer_of and producer_of[i] is not job
        ]
        prev = max(before, key=lambda j: best[id(j)][0], default=None)
        best[id(job)] = (job.wall + (best[id(prev)][0] if prev else 0.0), prev)
    if not jobs:
        return []
    last = max(jobs, key=lambda j: best[id(j)][0])
    chain = [last]
    while best[id(chain[-1])][1] is not None:
        chain.append(best[id(chain[-1])][1])
    return chain[::-1]


@dataclass(frozen=True)
class RuleCost:
    rule: str
    jobs: int
    wall: float
    cpu: float
    max_rss: float
    critical: float  # wall of its jobs on the critical path


@dataclass(frozen=True)
class Cost:
    """The study's cost: per rule, the critical path, the totals and the run's span."""

    rules: list[RuleCost]
    path: list[Job]
    jobs: list[Job]
    missing: list[Job]  # jobs with a benchmark pattern whose file is missing

    @property
    def benchmarked(self) -> list[Job]:
        return [j for j in self.jobs if j.cost]

    @property
    def wall(self) -> float:
        return sum(j.cost.wall for j in self.benchmarked)

    @property
    def cpu(self) -> float:
        return sum(j.cost.cpu for j in self.benchmarked)

    @property
    def max_rss(self) -> float:
        return max(
            (j.cost.max_rss for j in self.benchmarked if not math.isnan(j.cost.max_rss)),
            default=math.nan,
        )

    @property
    def critical(self) -> float:
        return sum(j.wall for j in self.path)

    @property
    def span(self) -> float:
        """From the first job's start to the last job's end (Snakemake's start-up and
        DAG before the first job not included)."""
        starts = [j.start for j in self.jobs if not math.isnan(j.start)]
        ends = [j.end for j in self.jobs if not math.isnan(j.end)]
        return max(ends) - min(starts) if starts and ends else math.nan


def study_cost(
    targets: Iterable[str],
    patterns: Mapping[str, Mapping[str, str]],
    metadata: str | os.PathLike = ".snakemake/metadata",
) -> Cost:
    """Read the run that made ``targets``: its jobs from ``metadata``, each job's
    benchmark file found by ``patterns`` (rule -> ``benchmark``, ``log`` patterns)."""
    jobs = jobs_from(read_records(metadata), targets)
    missing = []
    for job in jobs:
        job.benchmark = benchmark_path(job, patterns)
        if job.benchmark and os.path.exists(job.benchmark):
            job.cost = read_benchmark(job.benchmark)
        elif job.benchmark:
            missing.append(job)
    rules: dict[str, list[Job]] = {}
    for job in jobs:
        rules.setdefault(job.rule, []).append(job)
    path = critical_path(jobs)
    on_path = {id(j) for j in path}
    table = []
    for rule, members in rules.items():
        measured = [j.cost for j in members if j.cost]
        if not measured:
            continue
        rss = [c.max_rss for c in measured if not math.isnan(c.max_rss)]
        table.append(
            RuleCost(
                rule=rule,
                jobs=len(measured),
                wall=sum(c.wall for c in measured),
                cpu=sum(c.cpu for c in measured),
                max_rss=max(rss, default=math.nan),
                critical=sum(j.wall for j in members if id(j) in on_path),
            )
        )
    table.sort(key=lambda r: (-r.wall, r.rule))
    return Cost(rules=table, path=path, jobs=jobs, missing=missing)


def machine() -> str:
    """This machine in words: CPU model, logical CPUs (those this process may use),
    memory, OS and Python."""
    model = platform.processor() or platform.machine()
    try:
        text = Path("/proc/cpuinfo").read_text()
        found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
        model = found[1].strip() if found else model
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    memory = ""
    try:
        kb = re.search(r"^MemTotal:\s*(\d+) kB", Path("/proc/meminfo").read_text(), re.MULTILINE)
        memory = f", {int(kb[1]) / 1024**2:.0f} GiB memory" if kb else ""
    except OSError:
        pass
    return (
        f"{model}, {usable} of {os.cpu_count()} logical CPUs{memory}; "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def _jobs(n: int) -> str:
    return f"{n} job" if n == 1 else f"{n} jobs"


def _f(x: float, digits: int = 1) -> str:
    return "" if math.isnan(x) else f"{x:.{digits}f}"


CSV_HEADER = ("rule", "jobs", "wall_s", "cpu_s", "max_rss_mb", "critical_path_s")


def to_csv(cost: Cost) -> str:
    """One row per rule (most wall first), then ``total``."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    for r in cost.rules:
        writer.writerow(
            [r.rule, r.jobs, _f(r.wall, 2), _f(r.cpu, 2), _f(r.max_rss, 1), _f(r.critical, 2)]
        )
    writer.writerow(
        [
            "total",
            len(cost.benchmarked),
            _f(cost.wall, 2),
            _f(cost.cpu, 2),
            _f(cost.max_rss, 1),
            _f(cost.critical, 2),
        ]
    )
    return out.getvalue()


def to_markdown(cost: Cost, study: str, where: str) -> str:
    """The page: totals, the machine, the critical path job by job, the rules."""
    n = len(cost.benchmarked)
    lines = [
        f"# What the study `{study}` cost",
        "",
        f"Measured on {where}.",
        "",
        f"- **{_jobs(n)}**: {_f(cost.wall, 0)} wall-seconds, {_f(cost.cpu, 0)} CPU-seconds "
        f"in all; the largest peak resident memory of one job {_f(cost.max_rss, 0)} MB.",
        f"- **The run**: {_f(cost.span / 60, 1)} minutes from the first job's start to the "
        "last job's end (Snakemake's own start before the first job not counted).",
        f"- **The critical path**: {_jobs(len(cost.path))}, {_f(cost.critical, 0)} wall-seconds: "
        "no number of cores runs the study faster than this.",
    ]
    if cost.missing:
        lines.append(
            f"- **Not measured**: {len(cost.missing)} jobs whose benchmark file is missing: "
            + ", ".join(sorted(j.benchmark or j.rule for j in cost.missing))
        )
    lines += [
        "",
        "## The critical path",
        "",
        "| job | wall s | CPU s | peak MB |",
        "|---|--:|--:|--:|",
    ]
    for job in cost.path:
        c = job.cost or Benchmark(0.0, 0.0, math.nan)
        lines.append(f"| {job.name} | {_f(c.wall)} | {_f(c.cpu)} | {_f(c.max_rss, 0)} |")
    lines += [
        "",
        "## Per rule",
        "",
        "Most wall first; wall and CPU summed over the rule's jobs, the peak the largest of one job.",
        "",
        "| rule | jobs | wall s | CPU s | peak MB | on the critical path s |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for r in cost.rules:
        lines.append(
            f"| {r.rule} | {r.jobs} | {_f(r.wall)} | {_f(r.cpu)} | {_f(r.max_rss, 0)} | {_f(r.critical) if r.critical else ''} |"
        )
    lines.append(
        f"| **total** | {n} | {_f(cost.wall)} | {_f(cost.cpu)} | {_f(cost.max_rss, 0)} | {_f(cost.critical)} |"
    )
    return "\n".join(lines) + "\n"


def write(
    cost: Cost,
    md: str | os.PathLike,
    csv_path: str | os.PathLike,
    study: str,
    where: str | None = None,
) -> None:
    """``cost.md`` and ``cost.csv``, each written whole or not at all."""
    from distrank._io import atomic_write_bytes

    atomic_write_bytes(md, to_markdown(cost, study, where or machine()).encode())
    atomic_write_bytes(csv_path, to_csv(cost).encode())
