"""Who gains from teardown-run: a parent's spawn -> reaped time with and without it.

Usage: python3 benchmarks/scripts/teardown_run_gain.py [--teardown-run PATH] [--reps N] [--mib M]
                                                     [--python PATH] [--cc CC]

The standard library alone. Each case is a program that allocates M MiB (default 1024), touches
every page, says "ready" on stdout, and then ends one way:
  python, returns         python3: bytearray(M MiB), then the script ends normally
  python, os._exit(0)     python3: the same, then os._exit(0)
  python, SIGKILL         python3: the same, then waits; the parent kills it once it said "ready"
  C, returns from main    a C program (compiled here with CC): malloc(M MiB), memset, return 0
Each runs --reps times (default 5) plainly and under `teardown-run`, alternating (ABBA: which way
goes first changes every round), one at a time;
after each run the script waits until the helpers that run started have ended (their teardown
done), so that no run overlaps the previous one's teardown. Printed, per case and way, the median
of the runs:
  spawn -> reaped   from just before the spawn to waitpid's return (the parent's whole wait)
  spawn -> end      from the spawn to the "ready" line (for SIGKILL: the kill): starting,
                    allocating, touching; the same work both ways, and the noisy part
  end -> reaped     from there to waitpid's return: the exit, where teardown-run can gain
and the table in markdown. A process never holds more than M MiB (the helper shares its memory).
"""
import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HELPER_NAME = "teardown-shadow"  # process.hpp's default name for the helper

PYTHON_BODY = """import os, signal, sys, time
size = {size}
memory = bytearray(size)
memory[::4096] = b"\\x01" * (size // 4096)  # touch every page
print("ready", flush=True)
{end}
"""
PYTHON_ENDS = {
    "returns": "",
    "os._exit(0)": "os._exit(0)",
    "SIGKILL": "time.sleep(3600)",
}

C_SOURCE = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(int argc, char** argv) {
  size_t size = strtoull(argv[1], NULL, 10);
  char* memory = malloc(size);
  if (memory == NULL) return 1;
  memset(memory, 1, size);
  printf("ready\n");
  fflush(stdout);
  return memory[size - 1] == 1 ? 0 : 2;  /* returns from main: exit() frees nothing */
}
"""


def helpers():
    """The pids of the processes named like the shadow helper."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/comm") as comm:
                if comm.read().strip() == HELPER_NAME:
                    found.add(int(entry))
        except OSError:
            pass
    return found


def run_once(command, kill):
    """(spawn -> reaped, spawn -> end, end -> reaped) in ms for one run of command."""
    before = helpers()
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.PIPE)
    line = child.stdout.readline()
    if line.strip() != b"ready":
        child.kill()
        child.wait()
        sys.exit(f"teardown_run_gain: {command} said {line!r} instead of 'ready'")
    end = time.perf_counter()
    if kill:
        os.kill(child.pid, signal.SIGKILL)
        end = time.perf_counter()
    _, status = os.waitpid(child.pid, 0)
    reaped = time.perf_counter()
    child.returncode = os.waitstatus_to_exitcode(status)
    child.stdout.close()
    expected = -signal.SIGKILL if kill else 0
    if child.returncode != expected:
        sys.exit(f"teardown_run_gain: {command} ended with {child.returncode}, not {expected}")
    # The run's helpers (new since the spawn) end once they have torn the memory down.
    give_up = time.monotonic() + 30
    while helpers() - before and time.monotonic() < give_up:
        time.sleep(0.01)
    return (reaped - start) * 1e3, (end - start) * 1e3, (reaped - end) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teardown-run", default="build/default/tools/teardown-run")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--python", default="/usr/bin/python3")
    parser.add_argument("--cc", default="cc")
    options = parser.parse_args()
    launcher = str(Path(options.teardown_run).resolve())
    if not os.access(launcher, os.X_OK):
        sys.exit(f"teardown_run_gain: no teardown-run at {launcher} (build it, or give --teardown-run)")
    size = options.mib << 20

    with tempfile.TemporaryDirectory(prefix="teardown-run-gain.") as directory:
        c_program = Path(directory) / "touch_and_return"
        source = Path(directory) / "touch_and_return.c"
        source.write_text(C_SOURCE)
        subprocess.run([shutil.which(options.cc) or options.cc, "-O2", "-o", str(c_program), str(source)], check=True)
        cases = []
        for end, code in PYTHON_ENDS.items():
            script = PYTHON_BODY.format(size=size, end=code)
            cases.append((f"python3, {end}", [options.python, "-c", script], end == "SIGKILL"))
        cases.append(("C, returns from main", [str(c_program), str(size)], False))

        rows = []
        for name, command, kill in cases:
            times = {"plain": [], "teardown-run": []}
            for round_ in range(options.reps):
                ways = ["plain", "teardown-run"] if round_ % 2 == 0 else ["teardown-run", "plain"]
                for way in ways:
                    times[way].append(run_once(([launcher] if way == "teardown-run" else []) + command, kill))
            medians = {way: [statistics.median(t[i] for t in runs) for i in range(3)] for way, runs in times.items()}
            rows.append((name, medians))
            for way, runs in times.items():
                print(f"{name}, {way}: spawn -> reaped / spawn -> end / end -> reaped, ms: " +
                      "  ".join("%.0f/%.0f/%.1f" % t for t in runs), file=sys.stderr)

    print(f"{options.mib} MiB touched; medians of {options.reps}, in ms; plain / under teardown-run\n")
    print("| program, how it ends | spawn -> reaped | spawn -> end | end -> reaped | end -> reaped saved |")
    print("|---|---|---|---|---|")
    for name, medians in rows:
        plain, shadowed = medians["plain"], medians["teardown-run"]
        print(f"| {name} | {plain[0]:.0f} / {shadowed[0]:.0f} | {plain[1]:.0f} / {shadowed[1]:.0f} | "
              f"{plain[2]:.1f} / {shadowed[2]:.1f} | {plain[2] - shadowed[2]:+.1f} |")


if __name__ == "__main__":
    main()
