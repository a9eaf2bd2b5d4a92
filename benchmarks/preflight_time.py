"""How long ``tools/preflight.py`` takes on a config, check by check.

Runs the real command line (a fresh process per round, as a user runs
it) with ``--json`` and reports its own wall-clock seconds, the checks'
total and the slowest checks, and the share of the 60 s that preflight
is meant to stay under (it runs before every long training)::

    python benchmarks/preflight_time.py
    python benchmarks/preflight_time.py --config CONFIG --rounds 3
"""
import argparse
import json
import os.path as osp
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from benchmarks._common import machine, revision, uptime  # noqa: E402

BUDGET_S = 60.0
DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')


def run_once(config: str, work_dir: str) -> dict:
    """One preflight process; its JSON report, plus ``wall`` (the
    process's seconds, imports included)."""
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, osp.join(REPO_ROOT, 'tools', 'preflight.py'),
         config, '--work-dir', work_dir, '--json'],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    out = result.stdout
    if '{' not in out:
        raise RuntimeError(f'preflight printed no JSON (exit '
                           f'{result.returncode}):\n{result.stderr[-3000:]}')
    report = json.loads(out[out.index('{'):out.rindex('}') + 1])
    report['wall'] = time.perf_counter() - start
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--config', default=DEMO, help='config to check')
    parser.add_argument('--rounds', type=int, default=3,
                        help='preflight processes, one after the other')
    args = parser.parse_args(argv)
    print(f'uptime before: {uptime()}')
    print(f'machine: {machine()}; revision {revision()}')
    seconds, walls, per_check = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            report = run_once(args.config, osp.join(tmp, f'work{i}'))
            seconds.append(float(report['seconds']))
            walls.append(report['wall'])
            for name, value in (report.get('timings') or {}).items():
                per_check.setdefault(name, []).append(float(value))
    wall = statistics.median(walls)
    print(f'preflight on {osp.relpath(args.config, REPO_ROOT)}, '
          f'{len(walls)} rounds: process median {wall:.2f} s (min '
          f'{min(walls):.2f}, max {max(walls):.2f}), of it the checks '
          f'{statistics.median(seconds):.2f} s; share of the {BUDGET_S:g} s '
          f'budget: {wall / BUDGET_S:.3f}')
    slowest = sorted(per_check.items(),
                     key=lambda kv: -statistics.median(kv[1]))[:5]
    print('slowest checks (median s): ' + ', '.join(
        f'{name} {statistics.median(values):.2f}'
        for name, values in slowest))
    print(f'uptime after: {uptime()}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
