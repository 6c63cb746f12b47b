#!/usr/bin/env python3
"""A program that defers 0.45 GiB and returns from main, reaped by its parent, beside two processes
spinning at nice 0: the time from the end of main's work to the parent's waitpid, against the same
program that never frees the memory (the kernel frees it at exit) and one that deletes it inline.
Builds the child from benchmarks/scripts/deferred_exit_wait_child.cpp with c++ against include/.
Run it as root and as an ordinary user (setpriv --reuid=65534 --regid=65534 --clear-groups
--inh-caps=-all /usr/bin/python3 benchmarks/scripts/deferred_exit_wait.py); medians of --reps.

Usage: deferred_exit_wait.py [--reps N] [--cxx C++] [--child PATH]   (PATH: an already built child)
"""
import argparse
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

root = pathlib.Path(__file__).resolve().parents[2]


def build(cxx):
    out = pathlib.Path(tempfile.mkdtemp(prefix='deferred_exit_wait.')) / 'child'
    subprocess.run([cxx, '-std=c++20', '-O2', f'-I{root / "include"}',
                    str(root / 'benchmarks/scripts/deferred_exit_wait_child.cpp'), '-o', str(out), '-pthread'],
                   check=True)
    return str(out)


def one(child, mode):
    r, w = os.pipe()
    p = subprocess.Popen([child, mode], stdout=w)
    os.close(w)
    if os.read(r, 1) != b'e':
        sys.exit(f'the child ({mode}) ended before its work was done')
    start = time.monotonic()
    p.wait()
    end = time.monotonic()
    os.close(r)
    return (end - start) * 1000


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--reps', type=int, default=5)
    parser.add_argument('--cxx', default='c++')
    parser.add_argument('--child')
    args = parser.parse_args()
    if args.reps < 1:
        parser.error('--reps must be at least 1')
    child = args.child or build(args.cxx)
    spinners = [subprocess.Popen(['sh', '-c', 'while :; do :; done']) for _ in range(2)]
    time.sleep(0.3)
    try:
        runs = {mode: [] for mode in ('leak', 'inline', 'deferred')}
        for _ in range(args.reps):
            for mode, times in runs.items():
                times.append(one(child, mode))
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    print(f'uid {os.getuid()}, 2 processes spinning at nice 0, 0.45 GiB, end of main -> reaped (ms):')
    for mode, times in runs.items():
        print(f'  {mode:9s} median {statistics.median(times):8.1f}   ({", ".join(f"{t:.1f}" for t in times)})')
    leak = statistics.median(runs['leak'])
    print(f'  deferred / never freed: {statistics.median(runs["deferred"]) / leak:.2f}')


if __name__ == '__main__':
    main()
