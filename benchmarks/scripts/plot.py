"""Draws the benchmark plots from the JSON that benchmarks/run.sh leaves in OUT_DIR.

Usage: /usr/bin/python3 benchmarks/scripts/plot.py OUT_DIR IMG_DIR     (needs python3-matplotlib)

Reads from OUT_DIR (any file may be missing; a plot whose inputs are missing is skipped):
  llist_bench.json, budget_counter_static_key_bench.json (gate_bench.json, its name before),
  reaper_bench.json                                      Google Benchmark --benchmark_out JSON
  exit_matrix.json                                       benchmarks/exit_matrix --out
  machine.txt                                            run.sh's description of the machine
Writes into IMG_DIR:
  llist_scaling.png     llist push cost and its ratio to a contended fetch_add, by producers
  budget_scaling.png    budget reserve + release against its peers and limits, by threads
  exit_latency.png      exit-path latency and time until the memory is back, by size
  drain_throughput.png  the reaper's drain rate: GiB/s of address space, and trivial items/s
and prints the exit_matrix rows as markdown tables to stdout.

A Google Benchmark figure is the median over repetitions (the only run when not repeated); error
bars are one standard deviation of items/s, when repeated. exit_matrix figures are medians with
min/max error bars.
"""
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
from matplotlib.ticker import FuncFormatter, LogLocator  # noqa: E402

from bench_json import bench_runs, load, machine_line  # noqa: E402  (beside this file)

SEED_LABEL = "seed (bare metal, 32 CPUs)"
ASYNC_STYLE = {"off": ("tab:red", "o"), "on": ("tab:blue", "s"), "compiled_out": ("tab:gray", "^")}


def stat(value):
    """An exit_matrix figure, a number or a stat {median, min, max}, as a stat."""
    return value if isinstance(value, dict) else {"median": value, "min": value, "max": value}


def errorbar(ax, xs, stats, **style):
    """Medians with min-max bars."""
    medians = [s["median"] for s in stats]
    ax.errorbar(xs, medians, capsize=3, **style,
                yerr=[[m - s["min"] for m, s in zip(medians, stats)],
                      [s["max"] - m for m, s in zip(medians, stats)]])


def save(fig, title, machine, path, shared_legend=False):
    """Title and machine line on top; with shared_legend, one legend for all panels below."""
    height = fig.get_figheight()
    fig.text(0.5, 1 - 0.12 / height, title, ha="center", va="top", fontsize=13)
    fig.text(0.5, 1 - 0.42 / height, machine, ha="center", va="top", fontsize=9, color="dimgray")
    bottom = 0
    if shared_legend:
        entries = {}
        for ax in fig.axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                entries.setdefault(label, handle)
        columns = min(4, len(entries))
        fig.legend(entries.values(), entries.keys(), loc="lower center", ncol=columns,
                   fontsize=9, frameon=False)
        bottom = (0.1 + 0.22 * -(-len(entries) // columns)) / height
    fig.tight_layout(rect=(0, bottom, 1, 1 - 0.62 / height))
    fig.savefig(path, dpi=120)
    plt.close(fig)
    print(f"plot.py: wrote {path}", file=sys.stderr)


def log_y(ax):
    """A log y axis labelled at 1, 2 and 5 times each power of ten, in plain numbers."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1, 2, 5)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))


def thread_axis(ax, threads, label):
    if max(threads) > 2:
        ax.set_xscale("log", base=2)
    ax.set_xticks(threads)
    ax.set_xticklabels([str(t) for t in threads])
    ax.set_xlabel(label)
    ax.grid(True, which="both", alpha=0.3)


def plot_scaling(table, cases, limit, ratio, goal, xlabel, path, title, machine):
    """Left: ns per op by thread count (log). Right: each case against limit at the same count,
    as the docs give it: ratio "time" is its time over the limit's (lower is better), ratio
    "throughput" the limit's time over its (higher is better)."""
    colors = {case: f"C{i}" for i, case in enumerate(cases)}  # the same whatever is missing
    cases = [c for c in cases if c in table]
    if limit not in table or len(cases) < 2:
        print(f"plot.py: {path.name} skipped: {limit} or its peers did not run", file=sys.stderr)
        return
    threads = sorted({t for c in cases for t in table[c]})
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 6))
    ratios = []
    for case in cases:
        points = sorted(table[case].items())
        xs = [t for t, _ in points]
        err = [[ns - lo for _, (ns, (lo, _)) in points], [hi - ns for _, (ns, (_, hi)) in points]]
        style = (dict(color="black", linestyle="--", linewidth=2) if case == limit else
                 dict(color="gray", linestyle="-.") if case.startswith("limit/") else
                 dict(marker="o", color=colors[case]))
        left.errorbar(xs, [ns for _, (ns, _) in points], yerr=err, capsize=3, label=case, **style)
        shared = [t for t in xs if t in table[limit]]
        ys = [table[case][t][0] / table[limit][t][0] for t in shared]
        ratios += ys
        right.plot(shared, ys if ratio == "time" else [1 / y for y in ys], label=case, **style)
    log_y(left)
    left.set_ylabel("ns per operation, all threads together (log)")
    left.set_title("time per operation (lower is better)", fontsize=10)
    if max(ratios) / min(ratios) > 10:
        log_y(right)
    if ratio == "time":
        right.set_ylabel(f"time ÷ {limit}'s at the same thread count")
        right.set_title(f"ratio to {limit} (lower is better)", fontsize=10)
    else:
        right.set_ylabel(f"operations per second ÷ {limit}'s")
        right.set_title(f"throughput relative to {limit} (higher is better)", fontsize=10)
    if goal:
        right.axhline(goal[0], color="tab:green", linestyle=":", label=goal[1])
    for ax in (left, right):
        thread_axis(ax, threads, xlabel)
    save(fig, title, machine, path, shared_legend=True)


def seed_ms(row):
    """The seed's exit-path figure for this row's size and async setting, or None."""
    seed = row.get("seed") or {}
    return stat(seed["exit_path_ms"])["median"] if "exit_path_ms" in seed else None


def plot_exit_latency(rows, path, machine):
    rows = [r for r in rows if r.get("kind") == "exit_latency"]
    measured = [r for r in rows if not r.get("skipped")]
    if not measured and all(seed_ms(r) is None for r in rows):
        print(f"plot.py: {path.name} skipped: no exit_latency rows", file=sys.stderr)
        return
    panels = [("exit_path_ms", "exit path: the exit() that drops the last reference")]
    if any("memory_back_ms" in r for r in measured):
        panels.append(("memory_back_ms", "from that exit until the memory is free again"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    sizes = sorted({r["size_gib"] for r in rows})
    for ax, (field, what) in zip(axes[0], panels):
        for setting, (color, marker) in ASYNC_STYLE.items():
            mine = sorted((r for r in measured if r.get("async") == setting and field in r),
                          key=lambda r: r["size_gib"])
            if mine:
                errorbar(ax, [r["size_gib"] for r in mine], [stat(r[field]) for r in mine],
                         color=color, marker=marker, label=f"async {setting}")
            seeds = {(r["size_gib"], seed_ms(r)) for r in rows
                     if r.get("async") == setting and seed_ms(r) is not None}
            if field == "exit_path_ms" and seeds:
                ax.scatter(*zip(*sorted(seeds)), facecolors="none", edgecolors=color,
                           marker=marker, s=90, linewidths=1.5,
                           label=f"{SEED_LABEL}, async {setting}")
        log_y(ax)
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([f"{s:g}" for s in sizes])
        ax.set_xlabel("address-space size (GiB)")
        ax.set_ylabel("ms (log); median, bars min–max")
        ax.set_title(what, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, "Exit-path latency: synchronous teardown against the reaper", machine, path)


def plot_drain(rows, reaper, path, machine):
    rows = sorted((r for r in rows if r.get("kind") == "drain" and not r.get("skipped")),
                  key=lambda r: r["backlog_gib"])
    drains = {case: points for case, points in (reaper or {}).items() if case.startswith("drain/")}
    panels = (["gib"] if rows else []) + (["items"] if drains else [])
    if not panels:
        print(f"plot.py: {path.name} skipped: no drain rows and no reaper_bench drain cases",
              file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        if panel == "gib":
            xs = [r["backlog_gib"] for r in rows]
            ys = [stat(r["gib_per_s"])["median"] for r in rows]
            errorbar(ax, xs, [stat(r["gib_per_s"]) for r in rows], marker="o", color="tab:blue",
                     label="reaper, one worker")
            seed = next((r["seed"] for r in rows if r.get("seed")), {})
            gb = seed.get("gb_per_s")  # the seed says GB/s; drawn in GiB/s like the rest
            rate = seed.get("gib_per_s") or (gb or 0) * 1e9 / 2**30
            if rate:
                ys.append(rate)
                ax.axhline(rate, color="black", linestyle="--", label=f"{SEED_LABEL}: "
                           + (f"{gb:g} GB/s = " if gb else "") + f"{rate:.1f} GiB/s")
            ax.set_xticks(xs)
            ax.set_xticklabels([f"{x:g}" for x in xs])
            ax.set_xlabel("backlog torn down (GiB)")
            ax.set_ylabel("drain rate (GiB/s; median, bars min–max)")
            ax.set_ylim(0, max(ys) * 1.2)
            ax.set_title("address spaces (exit_matrix)", fontsize=10)
            ax.grid(True, alpha=0.3)
        else:
            threads = sorted({t for points in drains.values() for t in points})
            for case, points in drains.items():
                xs = sorted(points)
                ax.plot(xs, [1e3 / points[t][0] for t in xs], marker="o", label=case)
            thread_axis(ax, threads, "producer threads")
            ax.set_ylabel("items drained (M/s)")
            ax.set_title("trivial 64-byte items (reaper_bench)", fontsize=10)
        ax.legend(fontsize=8)
    save(fig, "Drain throughput of one reaper", machine, path)


def print_tables(rows):
    """Markdown for docs/benchmarks.md: exit latency by size, then every other kind as it is."""
    def cell(value):
        if isinstance(value, dict) and "median" in value:  # one rep: min = max = median
            if value["min"] == value["max"]:
                return f"{value['median']:.3g}"
            return f"{value['median']:.3g} ({value['min']:.3g}–{value['max']:.3g})"
        if isinstance(value, dict):  # decisions, or a seed's figures (without its prose)
            return ", ".join(f"{k} {cell(v)}" for k, v in value.items()
                             if k not in ("source", "measure"))
        return f"{value:.3g}" if isinstance(value, float) else str(value)

    latency = [r for r in rows if r.get("kind") == "exit_latency"]
    if latency:
        print("| size (GiB) | exit path, async off (ms) | async on (ms) | compiled out (ms) | "
              "reduction | memory back, off (ms) | memory back, on (ms) | seed, off → on (ms) |")
        print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for size in sorted({r["size_gib"] for r in latency}):
        by = {r.get("async"): r for r in latency if r["size_gib"] == size}
        measured = {a: r for a, r in by.items() if not r.get("skipped")}

        def get(setting, field):
            r = by.get(setting)
            return "" if r is None else "skipped" if r.get("skipped") else cell(r.get(field, ""))

        reduction = next((r["reduction"] for r in measured.values() if "reduction" in r), None)
        if reduction is None and "off" in measured and "on" in measured:
            reduction = (stat(measured["off"]["exit_path_ms"])["median"]
                         / stat(measured["on"]["exit_path_ms"])["median"])
        seeds = {a: seed_ms(r) for a, r in by.items() if seed_ms(r) is not None}
        print(f"| {size:g} | {get('off', 'exit_path_ms')} | {get('on', 'exit_path_ms')} | "
              f"{get('compiled_out', 'exit_path_ms')} | "
              f"{'' if reduction is None else f'{reduction:.0f}x'} | "
              f"{get('off', 'memory_back_ms')} | {get('on', 'memory_back_ms')} | "
              f"{' → '.join(f'{seeds[a]:g}' for a in ('off', 'on') if a in seeds)} |")
    for kind in dict.fromkeys(r.get("kind") for r in rows if r.get("kind") != "exit_latency"):
        mine = [r for r in rows if r.get("kind") == kind]
        columns = [k for k in dict.fromkeys(k for r in mine for k in r) if k != "kind"]
        print(f"\n{kind}:\n\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns))
        for r in mine:
            print("| " + " | ".join(cell(r.get(k, "")) for k in columns) + " |")


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    out_dir, img_dir = Path(argv[1]), Path(argv[2])
    img_dir.mkdir(parents=True, exist_ok=True)
    matrix = load(out_dir / "exit_matrix.json")
    rows = matrix.get("rows", []) if matrix else []
    machine = machine_line(out_dir, matrix)
    runs = {name: bench_runs(doc) for name in ("llist_bench", "reaper_bench")
            if (doc := load(out_dir / f"{name}.json"))}
    # budget_counter_static_key_bench was gate_bench: results saved under that name still plot.
    gates = out_dir / "budget_counter_static_key_bench.json"
    if not gates.exists() and (out_dir / "gate_bench.json").exists():
        gates = out_dir / "gate_bench.json"
    if (doc := load(gates)):
        runs["budget_counter_static_key_bench"] = bench_runs(doc)

    if "llist_bench" in runs:
        plot_scaling(runs["llist_bench"], ["llist/std", "sharded_llist/std", "llist/ao",
                     "peer/ck_stack_upmc", "peer/urcu_lfs", "peer/boost_lockfree_stack",
                     "peer/mutex_vector", "limit/fetch_add"], "limit/fetch_add", "time", None,
                     "producer threads (+1 consumer thread)", img_dir / "llist_scaling.png",
                     "llist: push cost by producers, against its peers and a contended fetch_add",
                     machine)
    if "budget_counter_static_key_bench" in runs:
        plot_scaling(runs["budget_counter_static_key_bench"], ["budget/add_then_check", "budget/exact",
                     "peer/mutex_budget", "limit/fetch_add_pair", "limit/fetch_add"],
                     "limit/fetch_add_pair", "throughput", (0.9, "goal: add_then_check ≥ 0.9x"),
                     "threads", img_dir / "budget_scaling.png",
                     "budget: try_reserve + release by threads, against a mutex and fetch_add",
                     machine)
    plot_exit_latency(rows, img_dir / "exit_latency.png", machine)
    plot_drain(rows, runs.get("reaper_bench"), img_dir / "drain_throughput.png", machine)
    if rows:
        print_tables(rows)


if __name__ == "__main__":
    main(sys.argv)
