"""Smoke runs of the benchmark scripts with tiny settings: each must run to
the end and print its figures. Timings are never asserted here (they belong
to benchmarks/README.md, measured in one run)."""
import re
import sys

import pytest

from tests.utils import run_command

# the scripts (launchers, benchmarks), the planner and the docs do not
# depend on the stack: run at one end (tests/conftest.py)
pytestmark = pytest.mark.one_end

# Hard limits only so that a hang fails; the machine is shared and slow.
TIMEOUT = 300
NUMBER = r'[0-9]+\.[0-9]+'


def _run(*args: str) -> str:
    result = run_command([sys.executable, *args], timeout=TIMEOUT)
    assert not result.timed_out, result
    assert result.returncode == 0, result
    assert 'uptime before:' in result.output
    assert 'uptime after:' in result.output
    return result.output


def _assert_overhead_figures(out: str) -> None:
    assert re.search(rf'RATIO median on/off: {NUMBER} \(95% bootstrap CI',
                     out), out[-3000:]
    assert re.search(rf'median s/iter guards on : {NUMBER}', out)
    assert re.search(rf'median s/iter guards off: {NUMBER}', out)
    assert re.search(rf'collectives \(Python torch.distributed calls\): '
                     rf'on {NUMBER}, off {NUMBER}, added -?{NUMBER}', out)
    assert re.search(rf'host syncs .*: on {NUMBER}, off {NUMBER}, added '
                     rf'-?{NUMBER}', out)


def test_guard_overhead_single(tmp_path):
    # blocks of 1 iteration: a warm-up, 2 timed (the bootstrap interval
    # needs 2 per mode), the counting and the profiling block
    out = _run('benchmarks/guard_overhead.py', '--iters', '2', '--block',
               '1', '--profile', '--work-dir', str(tmp_path))
    _assert_overhead_figures(out)
    assert 'single process, cpu' in out
    # no collective at all in a single process
    assert re.search(r'collectives .*: on 0\.00, off 0\.00, added 0\.00;',
                     out), out[-3000:]
    assert re.search(rf'self time of mmsafe guard code {NUMBER} ms/iteration',
                     out), out[-3000:]
    # the optim wrapper is guard code and runs every iteration
    assert 'nan_skip_optim_wrapper.py:step' in out


def test_guard_overhead_ddp(tmp_path):
    # a warm-up, 2 timed and the counting block of 1 iteration each: the
    # counted iteration is the run's last
    out = _run('benchmarks/guard_overhead.py', '--ddp', '--iters', '2',
               '--block', '1', '--work-dir', str(tmp_path))
    _assert_overhead_figures(out)
    assert '2-rank gloo DDP' in out
    # A healthy step adds no collective; the monitoring all-reduce runs at
    # the log interval and at the last iteration (inside the counted block).
    match = re.search(rf'added on ordinary steps: (-?{NUMBER})', out)
    assert match and float(match.group(1)) == 0.0, out[-3000:]
    match = re.search(rf'monitoring all-reduce \(log interval and last '
                      rf'iteration\): ({NUMBER});', out)
    assert match and float(match.group(1)) > 0.0, out[-3000:]


@pytest.fixture(scope='module')
def detect_recover_output():
    """One run of the three scenarios (one process start instead of three);
    rank 1 stalls 4 s past the watchdog's 2 s deadline."""
    return _run('benchmarks/detect_recover.py', '--only', 'worker', 'rank',
                'nan', '--probe-timeout', '2', '--watchdog-timeout', '2',
                '--stall-seconds', '6')


@pytest.mark.parametrize('scenario,pattern', [
    ('worker', r'== stuck DataLoader worker .*\n'
     rf'fallback done: -?{NUMBER} s past the deadline'),
    ('rank', r'== stalled rank .*\n(rank 0: .*\n)?'
     rf'rank 1: stack dump -?{NUMBER} s past the deadline'),
    ('nan', r'== NaN loss on rank 1 .*\n.*iterations from fault to skip: 0; '
     r'steps lost beyond the faulty one: 0'),
])
def test_detect_recover(detect_recover_output, scenario, pattern):
    out = detect_recover_output
    assert re.search(pattern, out), out[-3000:]


def test_data_loading(tmp_path):
    out = _run('benchmarks/data_loading.py', '--rounds', '1', '--batches',
               '3', '--large', '8', '--large-size', '320', '256',
               '--decode', '2', '--decode-rounds', '1', '--decode-passes',
               '1', '--decode-quality', '75', '--data-dir', str(tmp_path),
               # the two settings of the ratio checked below; every setting
               # and the OpenCV alone line: test_data_loading_stages.py
               '--decode-settings', 'full decode', 'reduced decode')
    assert len(re.findall(rf'num_workers=2: {NUMBER} pairs/s', out)) == 2
    assert len(re.findall(rf'num_workers=0: {NUMBER} pairs/s', out)) == 2
    assert '8 synthetic 320x256 pairs' in out
    # full vs reduced JPEG decoding at the LLVIP recipe's 640x512
    assert re.search(r'at 640x512, 2 pairs of 1280x1024, JPEG quality 75',
                     out), out[-3000:]
    assert re.search(rf'reduced/full, allocator as it is: {NUMBER}x',
                     out), out[-3000:]
    # only the chosen settings were measured
    assert re.search(rf'\nreduced decode +{NUMBER} \| +{NUMBER} +[0-9]+\n',
                     out), out[-3000:]
    assert 'decode + KeepFreedMemory' not in out, out[-3000:]
    assert 'OpenCV alone' not in out, out[-3000:]


def test_object_offsets():
    out = _run('benchmarks/object_offsets.py', '--size', '320', '256',
               '--pairs', '2')
    assert re.search(rf'object offsets, 320x256, 2 pairs, [1-9][0-9]* boxes '
                     rf'.*: {NUMBER} ms per box, {NUMBER} boxes/s', out), out


def test_preflight_time():
    out = _run('benchmarks/preflight_time.py', '--rounds', '1')
    assert re.search(rf'preflight on configs/llvip/demo_cpu.py, 1 rounds: '
                     rf'process median {NUMBER} s .*, of it the checks '
                     rf'{NUMBER} s; share of the 60 s budget: {NUMBER}',
                     out), out[-3000:]
    assert re.search(rf'slowest checks \(median s\): \w+ {NUMBER}', out)


def test_grad_spikes():
    out = _run('benchmarks/grad_spikes.py', '--warm', '3', '--batches', '1',
               '--frozen-bn')
    for label in ('at initialisation', 'after 3 training iterations'):
        assert re.search(rf'{label}: clean grad_norm median {NUMBER}', out), \
            out[-3000:]
    assert re.search(rf'  ir_raw16 +{NUMBER} +{NUMBER} +{NUMBER} +1/1', out)
