"""The many-core scaling figures, from one benchmarks/scaling.sh run, as markdown.

Usage: python3 benchmarks/scripts/scaling.py OUT_DIR   (the standard library alone: it also
                                                      runs from a pack on a machine with a bare
                                                      python3)

Reads from OUT_DIR (a missing file leaves its table out and its goal "not measured"):
  machine.txt          the machine, as scaling.sh described it
  llist_bench.json     Google Benchmark JSON: ns per push, all producers together, by producers
  pool_bench.json      benchmarks/pool_bench --out: GiB/s draining M concurrent 0.5 GiB items
  process_bench.json   benchmarks/process_bench --out: kill -> waitpid with and without the helper
Prints the three tables and the two many-core goals, each with this run's ratio and whether it met it:
  sharded_llist / llist (single head) ns per push at the highest producer count   goal <= 0.10
  reaper_pool with W = the most workers run / M concurrent inline munmaps         goal >= 0.8
"""
import sys
from pathlib import Path

from bench_json import bench_runs, load, machine_line

SINGLE_HEAD, SHARDED = "llist/std", "sharded_llist/std"
SHARDED_GOAL, POOL_GOAL = 0.10, 0.8
# The cases the table shows, in this order (a case the run lacks is left out).
LLIST_CASES = [SINGLE_HEAD, SHARDED, "limit/fetch_add", "llist/ao", "peer/ck_stack_upmc",
               "peer/urcu_lfs", "peer/boost_lockfree_stack", "peer/mutex_vector"]


def three(x):
    """A figure with three significant digits, without an exponent for the usual ranges."""
    return f"{x:.3g}" if x < 1000 else f"{x:.0f}"


def spread(stat):
    """A {median, min, max} as 'median [min, max]', or the median alone when they are equal."""
    if stat["min"] == stat["max"]:
        return three(stat["median"])
    return f"{three(stat['median'])} [{three(stat['min'])}, {three(stat['max'])}]"


def verdict(ratio, goal, met):
    """'**ratio** (goal ...: met)', with met(ratio) saying whether it is; or 'not measured'."""
    if ratio is None:
        return "not measured"
    return f"**{ratio:.3g}** (goal {goal}: {'met' if met(ratio) else 'NOT met'})"


def llist_table(doc):
    """The table, and the sharded / single-head ratio at the highest producer count."""
    # The consumer-bound cases count items at the consumer, not ns per push: not this table's.
    table = {c: runs for c, runs in bench_runs(doc).items() if not c.startswith("consumer_bound/")}
    cases = [c for c in LLIST_CASES if c in table] + sorted(set(table) - set(LLIST_CASES))
    producers = sorted({t for c in cases for t in table[c]})
    lines = ["| ns per push (all producers together) | " +
             " | ".join(str(p) for p in producers) + " |",
             "|---|" + "---:|" * len(producers)]
    for case in cases:
        cells = [three(table[case][p][0]) if p in table[case] else "" for p in producers]
        lines.append(f"| `{case}` | " + " | ".join(cells) + " |")
    ratio = None
    if SINGLE_HEAD in table and SHARDED in table:
        ratios = {p: table[SHARDED][p][0] / table[SINGLE_HEAD][p][0]
                  for p in producers if p in table[SHARDED] and p in table[SINGLE_HEAD]}
        lines.append("| sharded / single head | " +
                     " | ".join(f"{ratios[p]:.2f}" if p in ratios else "" for p in producers) +
                     " |")
        ratio = ratios[max(ratios)] if ratios else None
    if producers:
        # The issue quotes each producer's own cost per push (792 ns for a CAS list at 16): the
        # time all producers together take for one push, times the producers.
        top = max(producers)
        each = [f"`{c}` {three(table[c][top][0] * top)} ns"
                for c in (SINGLE_HEAD, SHARDED, "limit/fetch_add") if top in table.get(c, {})]
        lines += ["", f"Each producer's own cost per push at {top}: " + ", ".join(each) + "."]
    return lines, ratio, max(producers) if producers else None


def pool_table(doc):
    """The table, the ratio of the pool with the most workers, and that worker count."""
    config = doc.get("config", {})
    lines = [f"M = {config.get('m')} items of {config.get('each_gib')} GiB, medians of "
             f"{config.get('reps')}" + (f"; capped: {config['capped']}" if "capped" in config
                                        else ""), "",
             "| kind | workers | seconds | GiB/s | / inline | stolen |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in doc.get("rows", []):
        lines.append(f"| {row['kind']} | {row.get('workers', '–')} | {spread(row['seconds'])} | "
                     f"{row['gib_per_s']:.2f} | {row['ratio_to_inline']:.2f} | "
                     f"{row.get('stolen', '–')} |")
    pools = [r for r in doc.get("rows", []) if r["kind"] == "pool"]
    best = max(pools, key=lambda r: r["workers"]) if pools else None
    return lines, best and best["ratio_to_inline"], best and best["workers"]


def process_table(doc):
    lines = ["| GiB | technique | kill → waitpid (ms) | held at waitpid (GiB) | memory back (ms) | "
             "helper gone (ms) |", "|---:|---|---:|---:|---:|---:|"]
    for row in doc.get("rows", []):
        name = row.get("technique", row["helper"])
        if "skipped" in row:
            lines.append(f"| {row['size_gib']:g} | {name} | skipped: {row['skipped']} "
                         "| | | |")
            continue
        gone = spread(row["helper_gone_ms"]) if "helper_gone_ms" in row else "–"
        lines.append(f"| {row['size_gib']:g} | {name} | "
                     f"{spread(row['kill_to_waitpid_ms'])} | "
                     f"{row['held_at_waitpid_gib']['median']:.2f} | "
                     f"{spread(row['memory_back_ms'])} | {gone} |")
    return lines


def main(argv):
    if len(argv) != 2:
        sys.exit(__doc__)
    out_dir = Path(argv[1])
    print(f"Machine: {machine_line(out_dir, None)}\n")
    sharded_ratio = pool_ratio = producers = workers = None
    if (doc := load(out_dir / "llist_bench.json")):
        lines, sharded_ratio, producers = llist_table(doc)
        print("**sharded_llist: ns per push** (`llist_bench`; one consumer thread draining)\n")
        print("\n".join(lines) + "\n")
    if (doc := load(out_dir / "pool_bench.json")):
        lines, pool_ratio, workers = pool_table(doc)
        print("**reaper_pool: drain rate of M concurrent teardowns** (`pool_bench`)\n")
        print("\n".join(lines) + "\n")
    if (doc := load(out_dir / "process_bench.json")):
        print("**Killing a big process: kill → waitpid, shadow teardown and process_mrelease** "
              "(`process_bench`; medians [min, max])\n")
        print("\n".join(process_table(doc)) + "\n")
    print("The many-core goals in this run:\n")
    print(f"- sharded / single-head ns per push at {producers} producers: " +
          verdict(sharded_ratio, f"≤ {SHARDED_GOAL}", lambda r: r <= SHARDED_GOAL))
    print(f"- pool drain with {workers} workers / concurrent inline: " +
          verdict(pool_ratio, f"≥ {POOL_GOAL}", lambda r: r >= POOL_GOAL))


if __name__ == "__main__":
    main(sys.argv)
