"""Reading what the benchmarks wrote, with the standard library alone: plot.py (which needs
matplotlib) and scaling.py (which runs where only a bare python3 exists) both use it.
"""
import json
import re
import statistics
import sys
from pathlib import Path


def load(path):
    """The JSON document at path (a pathlib.Path), or None, said on stderr, if there is none."""
    if not path.exists():
        print(f"{Path(sys.argv[0]).name}: {path} not found", file=sys.stderr)
        return None
    return json.loads(path.read_text())


def bench_runs(doc):
    """Google Benchmark JSON -> {case: {threads: (ns per op, all threads together; (low, high))}}.

    The case is the registered name without the suffixes Google Benchmark appends to it.
    """
    medians, plain, spread = {}, {}, {}
    for run in doc.get("benchmarks", []):
        if run.get("error_occurred") or "items_per_second" not in run:
            continue
        case = re.sub(r"/(real_time|process_time|manual_time|threads:\d+|iterations:\d+|"
                      r"repeats:\d+|min_time:[\d.]+s?)", "", run["run_name"])
        key = (case, run["threads"])
        if run["run_type"] != "aggregate":
            plain.setdefault(key, []).append(run["items_per_second"])
        elif run["aggregate_name"] == "median":
            medians[key] = [run["items_per_second"]]
        elif run["aggregate_name"] == "stddev":
            spread[key] = run["items_per_second"]
    per_second = {**plain, **medians}
    table = {}
    for (case, threads), values in per_second.items():
        rate = statistics.median(values)
        sd = spread.get((case, threads), statistics.stdev(values) if len(values) > 1 else 0)
        low, high = 1e9 / (rate + sd), 1e9 / max(rate - sd, rate * 1e-3)
        table.setdefault(case, {})[threads] = (1e9 / rate, (low, high))
    return table


def machine_line(out_dir, matrix):
    """The machine as exit_matrix saw it, else as run.sh described it; run.sh's date either way."""
    path = out_dir / "machine.txt"
    text = path.read_text() if path.exists() else ""
    fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
    date = f", {fields['date']}" if "date" in fields else ""
    if matrix and "machine" in matrix:
        m = matrix["machine"]
        return (f"{m.get('cpu_model', '?')}, {m.get('cpus', '?')} CPUs, "
                f"{m.get('mem_total_gib', 0):.0f} GiB, kernel {m.get('kernel', '?')}{date}")
    if fields:
        memory = fields.get("memory", "?").split(" (")[0]
        return (f"{fields.get('cpu model', '?')}, {fields.get('cpus (nproc)', '?')} CPUs, "
                f"{memory}, kernel {fields.get('kernel', '?')}{date}")
    return "machine not recorded"
