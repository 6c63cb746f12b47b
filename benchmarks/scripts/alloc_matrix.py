#!/usr/bin/env python3
"""Deferred teardown under every allocator servers use: runs alloc_matrix once per allocator.

Usage: python3 benchmarks/scripts/alloc_matrix.py [--program PATH] [--out-dir DIR]
           [--allocators LIST] [--trim LIST] [--scale S] [--rounds N] [--quick] [-- ARGS...]
       python3 benchmarks/scripts/alloc_matrix.py --rerender [--out-dir DIR]

The standard library alone. Each allocator is a run of the program (macro/alloc_matrix.cpp)
with the allocator's library in LD_PRELOAD: glibc (none), jemalloc (Debian libjemalloc2),
tcmalloc (libtcmalloc-minimal4), mimalloc (libmimalloc2.0). One whose library is not installed
is reported as "skipped: <package> not installed" and the others run. --trim goes to the program
as it is (default: "default,native,malloc_trim": the library's default options, whatever its trim
does when run; the same options with the purge of the allocator the program detects itself; and
with glibc's malloc_trim whatever serves malloc, the library's trim before it detected the
allocator; under glibc the last two are one); ARGS after -- too. --program: by default the first
of build/bench (the bench preset), build/h-allocbench and build/default that has the program.

Written into --out-dir (default benchmarks/results; with --quick a fresh folder under /tmp):
alloc_matrix.json (every run's document, with the machine) and alloc_matrix.txt (the command,
the machine, each run's tables, then the markdown tables docs/benchmarks.md quotes: the matrix
with its ratios to inline and to the plain hand-off, the goals met or not, and the crossover per
allocator). The hand-off row is the limit of any deferral: the same deletes posted to one plain
thread at nice 19, no library (what the allocator charges for a free off the allocating thread,
and the peak when that thread falls behind); the goals are the deferred rows'. --rerender
runs nothing: it writes alloc_matrix.txt again from the alloc_matrix.json in --out-dir.

The goals (each deferred row against the inline row of its allocator and shape):
  rss      RSS above the start after the flush and the trim <= 5% of the garbage + 16 MiB
  peak     peak RSS over the rounds (no flush between) <= 1.3 x inline's
  free     the caller's free path (median over the rounds) <= inline's
  cpu      the CPU of the deferred frees (the reaper's, its trims included, + the caller's: its
           hand-overs and the frees the domain made inline) <= 1.1 x the inline caller's
           (glibc, jemalloc, tcmalloc only)
The crossover: per allocator, the smallest buffer size of the sweep from which on deferred is
no slower than inline on the caller (median ns per object), warm (after a warm-up round) and
cold (the child's first frees of that size); deferring loses below it.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

# name -> (Debian package, library soname); glibc's malloc needs no preload.
ALLOCATORS = {
    "glibc": (None, None),
    "jemalloc": ("libjemalloc2", "libjemalloc.so.2"),
    "tcmalloc": ("libtcmalloc-minimal4", "libtcmalloc_minimal.so.4"),
    "mimalloc": ("libmimalloc2.0", "libmimalloc.so.2"),
}
CPU_GOAL_ALLOCATORS = ("glibc", "jemalloc", "tcmalloc")


def find_library(soname):
    """The path of an installed shared library (ldconfig's cache, then the usual folders)."""
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, check=False).stdout
    except OSError:
        cache = ""
    for line in cache.splitlines():
        parts = line.strip().split(" => ")
        if len(parts) == 2 and parts[0].split(" ")[0] == soname and Path(parts[1]).exists():
            return parts[1]
    for folder in ("/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/lib"):
        path = Path(folder) / soname
        if path.exists():
            return str(path)
    return None


def default_program():
    for build in ("bench", "h-allocbench", "default"):
        path = ROOT / "build" / build / "benchmarks" / "alloc_matrix"
        if path.exists():
            return path
    return ROOT / "build" / "bench" / "benchmarks" / "alloc_matrix"


def package_version(package):
    result = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True,
                            check=False)
    return result.stdout.strip() if result.returncode == 0 else ""


def machine_lines():
    """describe_machine.sh's lines, with the compiler and each allocator package's version."""
    script = HERE / "describe_machine.sh"
    result = subprocess.run(["bash", "-c", f"source {shlex.quote(str(script))} && "
                             f"describe_machine \"compiler: $(g++ --version | head -n 1)\""],
                            capture_output=True, text=True, check=False)
    lines = result.stdout.strip().splitlines()
    versions = [f"{package} {package_version(package) or 'not installed'}"
                for package, _ in ALLOCATORS.values() if package is not None]
    return lines + ["allocators: glibc " + (package_version("libc6") or "?") + ", " + ", ".join(versions)]


def fmt(value, digits=0):
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}"


def ratio(a, b, digits=2):
    if a is None or b is None or b == 0:
        return "n/a"
    return f"{a / b:.{digits}f}"


def cpu_of(row):
    """The CPU the frees took: inline, the caller's; deferred, the reaper's and the caller's."""
    if row["mode"] == "inline":
        return row["caller_cpu_ms"]
    return row.get("cpu_ms", row["worker_cpu_ms"] + row["caller_cpu_ms"])


def matrix_rows(doc):
    return [row for row in doc["rows"] if row["part"] == "matrix"]


def sweep_rows(doc, part="sweep"):
    return [row for row in doc["rows"] if row["part"] == part]


def markdown_matrix(runs):
    lines = [
        "| allocator | shape | mode | free path ms | vs inline | garbage MiB | RSS after MiB (goal) "
        "| peak MiB | vs inline | vs hand-off | CPU ms | vs inline | vs hand-off | trims |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, doc in runs:
        inline = {}
        handoff = {}  # the plain thread's row: the limit of any deferral
        for row in matrix_rows(doc):
            cpu = cpu_of(row)
            if row["mode"] in ("inline", "handoff"):
                (inline if row["mode"] == "inline" else handoff)[row["shape"]] = dict(row, cpu=cpu)
            base = inline.get(row["shape"], {})
            limit = handoff.get(row["shape"], {}) if row["mode"] not in ("inline", "handoff") else {}
            free = row["free_ms"]["median"]
            lines.append(
                f"| {name} | {row['shape']} | {row['mode']} | {fmt(free, 3)} "
                f"| {ratio(free, base.get('free_ms', {}).get('median'), 3)} | {fmt(row['garbage_mib'])} "
                f"| {fmt(row['rss_after_mib'])} (≤ {fmt(row['rss_limit_mib'])}) | {fmt(row['peak_mib'])} "
                f"| {ratio(row['peak_mib'], base.get('peak_mib'))} | {ratio(row['peak_mib'], limit.get('peak_mib'))} "
                f"| {fmt(cpu)} | {ratio(cpu, base.get('cpu'))} | {ratio(cpu, limit.get('cpu'))} | {row['trims']} |")
    return lines


def goals(runs):
    """Per goal, the deferred rows that meet it and those that do not (as 'allocator shape mode: why')."""
    met = {"rss": [], "peak": [], "free": [], "cpu": []}
    missed = {"rss": [], "peak": [], "free": [], "cpu": []}
    for name, doc in runs:
        inline = {row["shape"]: row for row in matrix_rows(doc) if row["mode"] == "inline"}
        for row in matrix_rows(doc):
            if row["mode"] in ("inline", "handoff") or row["shape"] not in inline:
                continue  # the goals are the library's: its deferred rows
            base = inline[row["shape"]]
            who = f"{name} {row['shape']} {row['mode']}"
            rss, limit = row["rss_after_mib"], row["rss_limit_mib"]
            (met if rss <= limit else missed)["rss"].append(f"{who}: {fmt(rss)} MiB (goal ≤ {fmt(limit)})")
            peak = row["peak_mib"] / base["peak_mib"]
            (met if peak <= 1.3 else missed)["peak"].append(f"{who}: {peak:.2f}×")
            free = row["free_ms"]["median"] / base["free_ms"]["median"]
            (met if free <= 1 else missed)["free"].append(f"{who}: {free:.3f}×")
            if name in CPU_GOAL_ALLOCATORS:
                cpu = cpu_of(row) / base["caller_cpu_ms"] if base["caller_cpu_ms"] > 0 else float("inf")
                (met if cpu <= 1.1 else missed)["cpu"].append(f"{who}: {cpu:.2f}×")
    return met, missed


def crossover(points, unit="KiB"):
    """points: [(size, inline_ns, deferred_ns)] by size -> the smallest size from which on
    deferred <= inline, as text."""
    wins_from = None
    for size, inline_ns, deferred_ns in reversed(points):
        if inline_ns is None or deferred_ns is None or deferred_ns > inline_ns:
            break
        wins_from = size
    if wins_from is None:
        return f"loses at every size up to {points[-1][0]} {unit}"
    if wins_from == points[0][0]:
        return f"wins from {wins_from} {unit} (every size)"
    return f"loses below {wins_from} {unit}"


def markdown_sweep(runs, part="sweep", key="size_kib", unit="KiB"):
    label = "size KiB" if key == "size_kib" else "blocks"
    lines = [
        f"| allocator | {label} | warm: inline ns | deferred ns | ratio | cold: inline ns | deferred ns | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts = []
    for name, doc in runs:
        by_size = {}
        for row in sweep_rows(doc, part):
            by_size.setdefault(row[key], {})[row["mode"]] = row
        warm, cold = [], []
        for size in sorted(by_size):
            inl, de = by_size[size].get("inline"), by_size[size].get("deferred")
            if inl is None or de is None:
                continue
            wi, wd = inl["ns_per_object"]["median"], de["ns_per_object"]["median"]
            ci, cd = inl["cold_ns_per_object"]["median"], de["cold_ns_per_object"]["median"]
            warm.append((size, wi, wd))
            cold.append((size, ci, cd))
            lines.append(f"| {name} | {size} | {fmt(wi)} | {fmt(wd)} | {ratio(wd, wi)} "
                         f"| {fmt(ci)} | {fmt(cd)} | {ratio(cd, ci)} |")
        if warm:
            verdicts.append(f"- {name}: warm, deferring {crossover(warm, unit)}; cold, deferring "
                            f"{crossover(cold, unit)}")
    return lines, verdicts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--program", type=Path, default=None, help="alloc_matrix (default: build/bench/benchmarks/)")
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--allocators", default=",".join(ALLOCATORS))
    parser.add_argument("--trim", default="default,native,malloc_trim")
    parser.add_argument("--scale", default=None)
    parser.add_argument("--rounds", default=None)
    parser.add_argument("--quick", action="store_true", help="the program's --quick: a smoke run of seconds")
    parser.add_argument("--rerender", action="store_true",
                        help="no run: rewrite alloc_matrix.txt from the alloc_matrix.json in --out-dir")
    parser.add_argument("extra", nargs="*", help="after --: more arguments for the program")
    args = parser.parse_args()
    if args.rerender:
        out_dir = args.out_dir or ROOT / "benchmarks" / "results"
        write_report(out_dir, json.loads((out_dir / "alloc_matrix.json").read_text()))
        return 0

    program = args.program or default_program()
    if not program.exists():
        sys.exit(f"alloc_matrix.py: {program} not found (cmake --build --preset bench --target alloc_matrix)")
    out_dir = args.out_dir
    if out_dir is None:
        out_dir = Path(tempfile.mkdtemp(prefix="alloc_matrix.")) if args.quick else ROOT / "benchmarks" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    names = [n for n in args.allocators.split(",") if n]
    for name in names:
        if name not in ALLOCATORS:
            sys.exit(f"alloc_matrix.py: unknown allocator {name} (of {', '.join(ALLOCATORS)})")

    flags = ["--trim", args.trim]
    if args.quick:
        flags.append("--quick")
    if args.scale is not None:
        flags += ["--scale", args.scale]
    if args.rounds is not None:
        flags += ["--rounds", args.rounds]
    flags += args.extra
    command = "python3 benchmarks/scripts/alloc_matrix.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])

    started = time.monotonic()
    machine = machine_lines()
    runs, skipped = [], []
    for name in names:
        package, soname = ALLOCATORS[name]
        env = dict(os.environ)
        env.pop("LD_PRELOAD", None)
        preload = ""
        if soname is not None:
            preload = find_library(soname)
            if preload is None:
                line = f"{name}: skipped: {package} not installed"
                print(line, file=sys.stderr, flush=True)
                skipped.append({"allocator": name, "skipped": f"{package} not installed"})
                continue
            env["LD_PRELOAD"] = preload
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
            json_path = Path(tmp.name)
        argv = [str(program), "--allocator", name, "--json", str(json_path)] + flags
        print(f"== {name}: {'LD_PRELOAD=' + preload + ' ' if preload else ''}{' '.join(argv)}",
              file=sys.stderr, flush=True)
        result = subprocess.run(argv, env=env, stderr=subprocess.PIPE, text=True, check=False)
        sys.stderr.write(result.stderr)
        if result.returncode != 0:
            skipped.append({"allocator": name, "failed": f"exit status {result.returncode}"})
            json_path.unlink(missing_ok=True)
            continue
        doc = json.loads(json_path.read_text())
        json_path.unlink(missing_ok=True)
        doc["ld_preload"] = preload
        runs.append((name, doc, result.stderr.rstrip()))

    seconds = time.monotonic() - started
    document = {"benchmark": "alloc_matrix", "command": command, "machine": machine, "seconds": round(seconds, 1),
                "runs": [{"allocator": name, "document": doc, "output": output} for name, doc, output in runs],
                "skipped": skipped}
    (out_dir / "alloc_matrix.json").write_text(json.dumps(document, indent=1) + "\n")
    write_report(out_dir, document)
    return 1 if any("failed" in entry for entry in skipped) else 0


def write_report(out_dir, document):
    """alloc_matrix.txt from the document alloc_matrix.json holds (also for --rerender)."""
    runs = [(run["allocator"], run["document"]) for run in document["runs"]]
    outputs = {run["allocator"]: run.get("output", "") for run in document["runs"]}
    report = [f"command: {document['command']}", f"took: {document['seconds']:.0f} s"] + document["machine"] + [""]
    for name, doc in runs:
        report.append(f"== {name} (LD_PRELOAD={doc.get('ld_preload') or 'none'})\n{outputs[name]}")
    for entry in document["skipped"]:
        why = f"skipped: {entry['skipped']}" if "skipped" in entry else f"failed: {entry['failed']}"
        report.append(f"{entry['allocator']}: {why}")
    report += ["", "## The matrix (markdown)", ""] + markdown_matrix(runs) + [""]
    met, missed = goals(runs)
    titles = {"rss": "RSS after flush + trim ≤ 5% of garbage + 16 MiB",
              "peak": "peak RSS over the rounds ≤ 1.3× inline",
              "free": "free path deferred ≤ inline",
              "cpu": "CPU (reaper + caller) ≤ 1.1× inline CPU (glibc, jemalloc, tcmalloc)"}
    report += ["## The goals", ""]
    for key, title in titles.items():
        report.append(f"- {title}: met by {len(met[key])} of {len(met[key]) + len(missed[key])}")
        for miss in missed[key]:
            report.append(f"  - not met: {miss}")
    sweep_lines, verdicts = markdown_sweep(runs)
    report += ["", "## The crossover sweep (markdown, ns per object on the caller)", ""] + sweep_lines + [""]
    report += verdicts
    node_lines, node_verdicts = markdown_sweep(runs, "node_sweep", "nodes", "blocks")
    if len(node_lines) > 2:
        report += ["", "## The node sweep (markdown, ns per object of 64-byte blocks on the caller)", ""]
        report += node_lines + [""] + node_verdicts
    (out_dir / "alloc_matrix.txt").write_text("\n".join(report) + "\n")
    print("\n".join(report[report.index("## The matrix (markdown)"):]), file=sys.stderr)
    print(f"alloc_matrix.py: wrote {out_dir / 'alloc_matrix.txt'} and alloc_matrix.json ({document['seconds']:.0f} s)",
          file=sys.stderr)

if __name__ == "__main__":
    sys.exit(main())
