#!/usr/bin/env python3
"""Samples one-line logic mutants of the protocol headers and runs the tests that may catch each:
a comparison or boolean operator flipped (== !=, < <=, > >=, && ||), a negation dropped, a
returned true/false swapped, or a call statement deleted. The sample is drawn by seed, so a run
is replayable; each mutant is applied in place, the test programs mapped to its header rebuilt
and run (schedule tests at --schedules each), and the header restored, even on an error. A
mutant no program catches is either equivalent (it changes only how long something takes: a
spin that no longer sleeps, an extra wake) or a missing test. Run it in a scratch checkout
(`git worktree add --detach /tmp/mutants`), since it edits headers in place; it needs the
default preset configured there, or --build.

Usage: tests/unit/schedule/logic_mutants.py [--root DIR] [--build DIR] [--seed N] [--count N]
                                            [--schedules N] [--list]
  --seed N, --count N   which mutants, and how many (default: seed 1, 20)
  --list                print the sampled mutants and run nothing
"""
import argparse
import os
import pathlib
import random
import re
import signal
import subprocess


def interrupted(signum, frame):
    raise KeyboardInterrupt  # so the header being mutated is restored (the finally below)


signal.signal(signal.SIGTERM, interrupted)

parser = argparse.ArgumentParser()
parser.add_argument('--root', type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[3])
parser.add_argument('--build', type=pathlib.Path)
parser.add_argument('--seed', type=int, default=1)
parser.add_argument('--count', type=int, default=20)
parser.add_argument('--schedules', type=int, default=2000)
parser.add_argument('--list', action='store_true')
args = parser.parse_args()
root = args.root.resolve()
build = (args.build or root / 'build/default').resolve()

H = 'include/teardown/'
REAPER = ['reaper_test', 'reaper_schedule_test', 'reaper_help_schedule_test', 'reaper_driven_schedule_test',
          'composition_schedule_test', 'reaper_help_test', 'reaper_driven_test', 'reaper_drain_test',
          'reaper_boost_test', 'reaper_pool_test', 'reaper_poll_test', 'reaper_fork_test']
COMPOSITION = ['async_teardown_test', 'composition_schedule_test', 'allocator_trim_test', 'shared_worker_test',
               'async_teardown_pool_test', 'reaper_poll_test', 'pressure_policy_test']
# header: the test programs that may catch a mutant of it
PROGRAMS = {
    H + 'reaper/control.hpp': REAPER,
    H + 'reaper/wake_word.hpp': REAPER,
    H + 'reaper/worker_loop.hpp': REAPER,
    H + 'reaper/drive.hpp': ['reaper_driven_test', 'reaper_driven_schedule_test', 'reaper_test'],
    H + 'reaper/boost.hpp': ['reaper_boost_test', 'reaper_help_test', 'reaper_schedule_test', 'reaper_test'],
    H + 'reaper/fork.hpp': ['reaper_fork_test', 'reaper_schedule_test', 'reaper_test', 'reaper_boost_test'],
    H + 'reaper/reaper_class.hpp': REAPER,
    H + 'reaper_pool/stealing.hpp': ['reaper_pool_test', 'reaper_schedule_test', 'async_teardown_pool_test'],
    H + 'shared_worker.hpp': ['shared_worker_test', 'composition_schedule_test', 'allocator_trim_test'],
    H + 'async_teardown/composition.hpp': COMPOSITION,
    H + 'async_teardown/control.hpp': COMPOSITION,
    H + 'llist.hpp': ['llist_test', 'llist_schedule_test', 'reaper_test'],
    H + 'sharded_llist.hpp': ['sharded_llist_test', 'llist_schedule_test', 'reaper_schedule_test'],
    H + 'trace.hpp': ['trace_test', 'reaper_schedule_test'],
    H + 'event_count.hpp': ['llist_schedule_test', 'process_reaper_test'],
    H + 'reference_count.hpp': ['llist_schedule_test', 'mm_test', 'oom_reaper_test'],
}
OPERATORS = [
    (r'(?<![=!<>])==(?!=)', '!='), (r'!=', '=='),
    (r'(?<=\s)<(?=\s)', '<='), (r'(?<=\s)>(?=\s)', '>='), (r'(?<=\s)<=(?=\s)', '<'), (r'(?<=\s)>=(?=\s)', '>'),
    (r' && ', ' || '), (r' \|\| ', ' && '),
    (r'\bif \(!', 'if ('), (r'\breturn true;', 'return false;'), (r'\breturn false;', 'return true;'),
]
NOT_CODE = re.compile(r'^\s*(//|#|static_assert|template|requires|using|namespace|throw|\}|\{|case )|"')
CALL_STATEMENT = re.compile(r'^\s*[A-Za-z_:.>\-\[\]()0-9]+(\.|->|::)[A-Za-z_]+\(.*\);\s*(//.*)?$|^\s*(\+\+|--)[A-Za-z_.]+;')


def candidates():
    found = []
    for header in PROGRAMS:
        for number, line in enumerate((root / header).read_text().splitlines()):
            code = line.split('//')[0]
            if NOT_CODE.match(line) or not code.strip():
                continue
            for pattern, replacement in OPERATORS:
                for match in re.finditer(pattern, code):
                    found.append((header, number, line[:match.start()] + replacement + line[match.end():]))
            if CALL_STATEMENT.match(code) and 'return' not in code and '=' not in code.split('(')[0]:
                found.append((header, number, ''))
    return found


def run(command, timeout, env=None):
    # A group of its own, killed whole at the timeout: a death test's child (or a hung fork) must
    # not outlive its program and eat a CPU through the rest of the sample.
    with subprocess.Popen(command, cwd=build, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          start_new_session=True) as process:
        try:
            status = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            status = 'timeout'
        try:
            os.killpg(process.pid, signal.SIGKILL)  # what is left of the group, if anything
        except ProcessLookupError:
            pass
        process.wait()
        return status


def main():
    pool = candidates()
    sample = random.Random(args.seed).sample(pool, min(args.count, len(pool)))
    print(f'logic_mutants: {len(pool)} candidates; seed {args.seed}, {len(sample)} sampled', flush=True)
    env = dict(os.environ, TEARDOWN_SCHEDULES=str(args.schedules))
    caught = 0
    for index, (header, number, mutated) in enumerate(sample, 1):
        path = root / header
        original = path.read_text()
        lines = original.splitlines(keepends=True)
        before = lines[number].strip()
        where = f'[{index}/{len(sample)}] {header}:{number + 1}: {before!r} -> {mutated.strip()!r}'
        if args.list:
            print(where)
            continue
        lines[number] = mutated + '\n'
        path.write_text(''.join(lines))
        try:
            verdict = 'MISSED'
            if run(['cmake', '--build', '.', '--target'] + PROGRAMS[header], 1800) != 0:
                verdict = 'caught by the build'
            else:
                for program in PROGRAMS[header]:
                    status = run([f'tests/{program}', '--gtest_brief=1'], 300, env)
                    if status != 0:
                        verdict = f'caught by {program} ({status})'
                        break
        finally:
            path.write_text(original)
        caught += verdict != 'MISSED'
        print(f'{where}: {verdict}', flush=True)
    if not args.list:
        run(['cmake', '--build', '.'], 1800)
        print(f'logic_mutants: caught {caught} of {len(sample)}', flush=True)


main()
