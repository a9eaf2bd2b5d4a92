"""Every attack on checkpoint loading that mmsafe knows, as a file, is
refused with one clear error, and leaves no trace: no marker file, no
change of a watched file (mode, owner, mtime, content), no change of
MessageHub's statistics, no output of a TorchScript payload, no hang, no
crash, within memory limits.

The payloads load in a sandboxed subprocess (tests/checkpoint/sandbox.py):
one process per way in (``loader``: ``load_from``, ``--resume PATH``,
``tools/test.py`` and pretrained weights go through MMEngine's
CheckpointLoader; ``resume``: auto-resume finds the file in the work dir;
``convert``: tools/convert_checkpoint.py converts nothing of them);
two runs of ``tools/train.py`` and one of ``tools/test.py`` check the whole
path."""
import os
import os.path as osp
import sys

import pytest

from tests.checkpoint.payloads import PAYLOADS, TORCHSCRIPT_SIGN, write_all
from tests.checkpoint.sandbox import run_sandbox
from tests.engine.ckpt_toys_cfg import TOY_CONFIG
from tests.utils import REPO_ROOT, run_command, write_config

REFUSALS = ('UntrustedCheckpointError', 'CheckpointFormatError')
#: the address space and CPU seconds of a tools/*.py run
LIMITS = (8 << 30, 600)


def _expected(name, mode, record):
    """Whether ``record`` is the refusal this payload must get."""
    if name == 'trusted_alias_os_system':
        return record.get('type') == 'ValueError' and \
            'cannot be trusted' in record.get('error', '')
    if record.get('type') in REFUSALS:
        return True
    # auto-resume skips a file of another format, then has none left
    return mode == 'resume' and record.get('type') == 'RuntimeError' and \
        'Cannot resume' in record['error'] and \
        'CheckpointFormatError' in record['error']


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize('mode', ['loader', 'resume', 'convert'])
def test_every_payload_is_refused_without_a_trace(tmp_path, mode):
    payloads = write_all(str(tmp_path / 'payloads'))
    assert set(payloads) == set(PAYLOADS)
    records = run_sandbox(payloads, mode, str(tmp_path))
    problems = []
    for name in sorted(payloads):
        record = records[name]
        if not _expected(name, mode, record):
            problems.append(f'{name}: {record}')
        for effect in ('marker', 'watched_changed', 'statistics_changed'):
            if record.get(effect):
                problems.append(f'{name}: {effect}')
        if TORCHSCRIPT_SIGN in record.get('printed', ''):
            problems.append(f'{name}: its TorchScript code ran')
        if record.get('seconds', 0) > 10:
            problems.append(f'{name}: took {record["seconds"]} s')
    assert not problems, '\n'.join(problems)
    alias = records['alias_os_system']['error']
    assert 'can never be trusted' in alias
    assert "mmsafe_trusted_globals = ['" not in alias
    assert 'TorchScript archive' in records['torchscript_setstate']['error']
    assert 'tar archive' in records['tar_hardlink']['error']
    assert 'is not a regular file' in records['fifo_path']['error'] or \
        mode == 'resume'


def _limited(script, *args):
    """``python script args`` with the address space and CPU time of
    :data:`LIMITS`."""
    memory, cpu = LIMITS
    code = ('import resource, runpy, sys\n'
            f'resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))\n'
            f'resource.setrlimit(resource.RLIMIT_CPU, ({cpu}, {cpu}))\n'
            f'sys.argv = {[script, *args]!r}\n'
            'runpy.run_path(sys.argv[0], run_name="__main__")\n')
    return [sys.executable, '-c', code]


def _assert_untouched(payload, output):
    assert not osp.exists(payload['marker']), output
    info = os.stat(payload['watched'])
    assert (info.st_mode & 0o7777, info.st_mtime) == (0o600, 1_000_000_000), \
        output
    assert TORCHSCRIPT_SIGN not in output


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_train_py_load_from_and_resume_refuse_payloads(tmp_path):
    payloads = write_all(str(tmp_path / 'payloads'),
                         ['torchscript_setstate', 'tar_hardlink'])
    config = write_config(str(tmp_path / 'toy.py'), TOY_CONFIG.format(
        max_epochs=1, max_keep=-1, custom_hooks='[]'))
    train = osp.join(REPO_ROOT, 'tools', 'train.py')
    script = payloads['torchscript_setstate']
    result = run_command(_limited(
        train, config, '--work-dir', str(tmp_path / 'work_load'),
        '--cfg-options', f"load_from={script['path']}"), timeout=400)
    assert result.returncode != 0 and not result.timed_out, result
    assert 'CheckpointFormatError' in result.output, result
    assert 'is a TorchScript archive' in result.output, result
    _assert_untouched(script, result.output)
    # --resume: the tar payload is the newest checkpoint of the work dir
    tar = payloads['tar_hardlink']
    work_dir = tmp_path / 'work_resume'
    work_dir.mkdir()
    target = work_dir / 'epoch_1.pth'
    target.write_bytes(open(tar['path'], 'rb').read())
    (work_dir / 'last_checkpoint').write_text(str(target))
    result = run_command(_limited(train, config, '--work-dir',
                                  str(work_dir), '--resume'), timeout=400)
    assert result.returncode != 0 and not result.timed_out, result
    assert 'Cannot resume' in result.output, result
    assert 'is a tar archive' in result.output, result
    _assert_untouched(tar, result.output)


TEST_PARTS = """
val_dataloader = None
test_dataloader = dict(
    batch_size=2, num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    collate_fn=dict(type='pseudo_collate'),
    dataset=dict(type='CkptToyDataset', length=4))
test_cfg = dict(type='TestLoop')
test_evaluator = dict(type='Evaluator', metrics=[])
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_test_py_refuses_a_payload(tmp_path):
    payloads = write_all(str(tmp_path / 'payloads'), ['os_system'])
    config = write_config(str(tmp_path / 'toy.py'), TOY_CONFIG.format(
        max_epochs=1, max_keep=-1, custom_hooks='[]') + TEST_PARTS)
    evil = payloads['os_system']
    result = run_command(_limited(
        osp.join(REPO_ROOT, 'tools', 'test.py'), config, evil['path'],
        '--work-dir', str(tmp_path / 'work')), timeout=400)
    assert result.returncode != 0 and not result.timed_out, result
    assert 'UntrustedCheckpointError' in result.output, result
    assert '`posix.system`' in result.output, result
    _assert_untouched(evil, result.output)
