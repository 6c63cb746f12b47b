#!/usr/bin/env python3
"""Weakens each non-relaxed memory order of the lock-free headers in turn, one step, and runs the
schedule tests under weak memory (memory_model.hpp) to see whether they catch it: a caught
weakening prints the schedule that failed; one that nothing catches is either unneeded (weaken it
in the header) or a scenario is missing. Each header is restored afterwards, even on an error;
run it in a scratch checkout (`git worktree add --detach /tmp/orders`), since it edits headers
in place. Needs the default preset configured there, or --build.

Usage: tests/unit/schedule/weakened_orders.py [--root DIR] [--build DIR] [--schedules N]
                                              [--list] [site...]
  site            FILE:LINE:ORDER->WEAKER as --list prints them (default: every one)
  --schedules N   schedules per explore (TEARDOWN_SCHEDULES; default 2000)
  --build DIR     a tsan preset's build folder runs the tests under ThreadSanitizer too (through
                  `setarch -R`), which reports a weakened order that leaves plain data unordered
One step weaker: acquire -> relaxed, release -> relaxed, acq_rel -> acquire and -> release,
seq_cst -> acquire (a load), -> release (a store), -> acq_rel (a read-modify-write).
"""
import argparse
import pathlib
import re
import signal
import subprocess
import sys


def interrupted(signum, frame):
    raise KeyboardInterrupt  # so the header being weakened is restored (the finally below)


signal.signal(signal.SIGTERM, interrupted)

parser = argparse.ArgumentParser()
parser.add_argument('--root', type=pathlib.Path, default=pathlib.Path(__file__).resolve().parents[3])
parser.add_argument('--build', type=pathlib.Path)
parser.add_argument('--schedules', type=int, default=2000)
parser.add_argument('--list', action='store_true')
parser.add_argument('--wrap', default=None, help='a command to run each test under (default: setarch -R for tsan)')
parser.add_argument('sites', nargs='*')
args = parser.parse_args()
root = args.root.resolve()
build = (args.build or root / 'build/default').resolve()

H = 'include/teardown/'
# header: the schedule test programs whose scenarios reach it
HEADERS = {
    H + 'llist.hpp': ['llist_schedule_test', 'reaper_schedule_test'],
    H + 'sharded_llist.hpp': ['llist_schedule_test', 'reaper_schedule_test'],
    H + 'reaper/wake_word.hpp': ['reaper_schedule_test', 'composition_schedule_test'],
    H + 'reaper/control.hpp': ['reaper_schedule_test', 'composition_schedule_test', 'reaper_help_schedule_test'],
    H + 'reaper/worker_loop.hpp': ['reaper_schedule_test', 'composition_schedule_test', 'reaper_help_schedule_test'],
    H + 'reaper/drive.hpp': ['reaper_driven_schedule_test'],
    H + 'reaper/cpu_clock.hpp': ['reaper_schedule_test'],
    H + 'reaper/reaper_class.hpp': ['reaper_schedule_test'],
    H + 'reaper_pool/stealing.hpp': ['reaper_schedule_test'],
    H + 'reaper_pool.hpp': ['reaper_schedule_test'],
    H + 'trace.hpp': ['reaper_schedule_test'],
    H + 'shared_worker.hpp': ['shared_worker_test'],
    H + 'async_teardown/composition.hpp': ['composition_schedule_test'],
    H + 'snapshot_count.hpp': ['llist_schedule_test'],
    H + 'event_count.hpp': ['llist_schedule_test'],
    H + 'reference_count.hpp': ['llist_schedule_test'],
    H + 'model/aio.hpp': ['composition_schedule_test'],
}
ORDER = re.compile(r'std::memory_order_(acquire|release|acq_rel|seq_cst)\b')


def weaker(order, line, at):
    if order == 'acquire' or order == 'release':
        return ['relaxed']
    if order == 'acq_rel':
        return ['acquire', 'release']
    before = line[:at]
    if re.search(r'\.load\([^()]*$', before):
        return ['acquire']
    if re.search(r'\.store\([^()]*(\([^()]*\))?[^()]*$', before):
        return ['release']
    return ['acq_rel']


def sites():
    for f in HEADERS:
        for number, line in enumerate((root / f).read_text().splitlines(), 1):
            code = line.split('//')[0]
            for m in ORDER.finditer(code):
                for w in weaker(m.group(1), code, m.start()):
                    yield f'{f}:{number}:{m.start()}:{m.group(1)}->{w}'


every = list(sites())
if args.wrap is not None:
    wrap = args.wrap.split()
elif 'tsan' in build.name:
    wrap = ['setarch', subprocess.run(['uname', '-m'], capture_output=True, text=True).stdout.strip(), '-R']
else:
    wrap = []
if args.list:
    print('\n'.join(every))
    sys.exit(0)
chosen = args.sites or every
missed = []
for site in chosen:
    f, number, column, change = site.split(':')
    order, w = change.split('->')
    path = root / f
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    line = lines[int(number) - 1]
    at = int(column)
    assert line[at:].startswith('std::memory_order_' + order), site
    lines[int(number) - 1] = line[:at] + line[at:].replace('std::memory_order_' + order, 'std::memory_order_' + w, 1)
    path.write_text(''.join(lines))
    try:
        programs = HEADERS[f]
        b = subprocess.run(['cmake', '--build', str(build), '-j2', '--target', *programs],
                           capture_output=True, text=True)
        if b.returncode != 0:
            print(f'== {site}: does not build (a failure order stronger than success?)', flush=True)
            continue
        caught = []
        for program in programs:
            r = subprocess.run(['timeout', '900', *wrap, str(build / 'tests' / program)], capture_output=True,
                               text=True, env={'TEARDOWN_SCHEDULES': str(args.schedules), 'PATH': '/usr/bin:/bin'})
            failed = [l for l in (r.stdout + r.stderr).splitlines() if '; FAILED under' in l or 'schedule: ' in l and
                      ('deadlock' in l or 'livelock' in l) or 'ThreadSanitizer: data race' in l]
            if r.returncode != 0:
                caught.append(f'{program}: ' + (failed[0] if failed else f'rc={r.returncode}'))
        print(f'== {site}: ' + ('CAUGHT ' + caught[0][:300] if caught else 'MISSED'), flush=True)
        if not caught:
            missed.append(site)
    finally:
        path.write_text(text)
print(f'{len(chosen) - len(missed)} of {len(chosen)} weakenings caught; missed:', *missed, sep='\n  ')
