"""Pretrained weights on an offline machine: preflight names the missing
file, where to place it and the --cfg-options line; training stops with one
clear error instead of a urllib traceback; a cached file loads without
network. https://weights.invalid/ never resolves (RFC 2606), so these tests
need no network and show what an offline node sees."""
import os
import os.path as osp
import sys

import pytest
import torch

from tests.utils import REPO_ROOT, run_command, run_train, write_config

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
URL = 'https://weights.invalid/resnet50.pth'


@pytest.fixture
def torch_home(tmp_path, monkeypatch):
    """An empty torch hub cache for this test (and its subprocesses)."""
    home = str(tmp_path / 'torch_home')
    monkeypatch.setenv('TORCH_HOME', home)
    return home


def pretrained_config(directory, data_root, checkpoint=URL, load_from=None):
    """The CPU demo, shrunk, with a pretrained visible backbone."""
    return write_config(osp.join(directory, 'pretrained.py'), f"""
        _base_ = [{DEMO!r}]
        data_root = {data_root!r}
        synthetic = dict(num_train=4, num_test=2, img_size=(64, 64), seed=0)
        train_dataloader = dict(batch_size=2, dataset=dict(
            data_root=data_root, synthetic=synthetic))
        val_dataloader = dict(batch_size=2, dataset=dict(
            data_root=data_root, synthetic=synthetic))
        test_dataloader = val_dataloader
        train_cfg = dict(max_epochs=1, val_interval=1)
        model = dict(backbone=dict(init_cfg=dict(
            _delete_=True, type='Pretrained', checkpoint={checkpoint!r})))
        load_from = {load_from!r}
        """)


def _preflight(config, work_dir):
    from mmsafe.preflight import run_preflight
    from mmsafe.tools import preflight as cli
    from mmsafe.tools.train import build_cfg
    parsed = cli.parse_args([config, '--work-dir', work_dir])
    cfg = build_cfg(parsed)
    return run_preflight(cfg, 'none', skip=('data', 'dataloader'))


def test_preflight_error_names_cache_path_and_cfg_options(tmp_path,
                                                          torch_home):
    config = pretrained_config(str(tmp_path), str(tmp_path / 'data') + '/',
                               load_from='https://weights.invalid/det.pth')
    report = _preflight(config, str(tmp_path / 'work'))
    cached = osp.join(torch_home, 'hub', 'checkpoints', 'resnet50.pth')
    rows = {r.where: r for r in report.find('checkpoint', 'error')}
    row = rows['model.backbone.init_cfg.checkpoint']
    assert URL in row.what and cached in row.what, row
    assert f'Place the file at {cached}' in row.fix, row
    assert ('--cfg-options model.backbone.init_cfg.checkpoint=/path/to/'
            'resnet50.pth') in row.fix, row
    assert '--cfg-options model.backbone.init_cfg=None' in row.fix, row
    row = rows['load_from']
    assert 'https://weights.invalid/det.pth' in row.what, row
    assert osp.join(torch_home, 'hub', 'checkpoints', 'det.pth') in row.fix
    assert '--cfg-options load_from=None' in row.fix, row
    assert report.has_errors


def test_preflight_ok_when_the_file_is_in_the_hub_cache(tmp_path,
                                                       torch_home):
    cached = osp.join(torch_home, 'hub', 'checkpoints', 'resnet50.pth')
    os.makedirs(osp.dirname(cached))
    torch.save({'conv1.weight': torch.zeros(1)}, cached)
    config = pretrained_config(str(tmp_path), str(tmp_path / 'data') + '/')
    report = _preflight(config, str(tmp_path / 'work'))
    assert not report.find('checkpoint', 'error'), report.format_text()
    assert any(cached in r.what and r.where ==
               'model.backbone.init_cfg.checkpoint'
               for r in report.find('checkpoint', 'ok'))


def test_preflight_missing_local_pretrained_path(tmp_path, torch_home):
    config = pretrained_config(str(tmp_path), str(tmp_path / 'data') + '/',
                               checkpoint=str(tmp_path / 'no' / 'r18.pth'))
    report = _preflight(config, str(tmp_path / 'work'))
    rows = report.find('checkpoint', 'error')
    assert any('does not exist' in r.what and
               '--cfg-options model.backbone.init_cfg=None' in r.fix
               for r in rows), report.format_text()


def test_backbone_pretrained_key_is_checked(tmp_path, torch_home):
    from mmengine.config import Config

    from mmsafe.preflight import run_preflight
    cfg = Config(dict(model=dict(type='X', backbone=dict(
        type='ResNet', pretrained='https://weights.invalid/r18.pth'))))
    report = run_preflight(cfg, 'none', skip=(
        'registry', 'model', 'data', 'dataloader', 'batch', 'work_dir',
        'visualizer', 'distributed', 'guards', 'console', 'amp'))
    rows = report.find('checkpoint', 'error')
    assert any(r.where == 'model.backbone.pretrained' and
               '--cfg-options model.backbone.pretrained=None' in r.fix
               for r in rows), report.format_text()


def test_training_offline_fails_with_one_clear_error(tmp_path, torch_home):
    config = pretrained_config(str(tmp_path), str(tmp_path / 'data') + '/')
    result = run_train(config, timeout=300,
                       args=['--work-dir', str(tmp_path / 'work')],
                       env=dict(TORCH_HOME=torch_home))
    assert not result.timed_out, result
    assert result.returncode != 0, result
    cached = osp.join(torch_home, 'hub', 'checkpoints', 'resnet50.pth')
    lines = result.output.strip().splitlines()
    # what a user reads last is the whole story, in one block: the error
    # and where its full traceback is; no library traceback on screen
    error, where = lines[-2], lines[-1]
    assert error.startswith('WeightsUnavailableError: '), result
    assert URL in error and cached in error, error
    assert 'Fix: download' in error and 'tools/preflight.py' in error
    assert '--cfg-options model.backbone.init_cfg=None' in error, error
    assert 'Traceback (most recent call last)' not in result.output, result
    assert 'socket.gaierror' not in result.output
    # chained to the real cause, never swallowed: in the log file, and on
    # screen when asked for
    log = where.split('full traceback: in ')[1].split(', or run again')[0]
    with open(log, encoding='utf-8') as f:
        text = f.read()
    assert 'URLError' in text and 'direct cause' in text, text[-3000:]
    debug = run_train(config, timeout=300,
                      args=['--work-dir', str(tmp_path / 'work2')],
                      env=dict(TORCH_HOME=torch_home, MMSAFE_DEBUG='1'))
    assert debug.returncode != 0 and 'direct cause' in debug.output
    assert 'Traceback (most recent call last)' in debug.output


def test_mmdetection_train_py_gets_the_same_error(tmp_path, torch_home):
    import mmdet
    mmdet_train = osp.join(osp.dirname(mmdet.__file__), '.mim', 'tools',
                           'train.py')
    if not osp.isfile(mmdet_train):
        pytest.skip('this mmdet install has no .mim/tools/train.py')
    config = pretrained_config(str(tmp_path), str(tmp_path / 'data') + '/')
    result = run_command(
        [sys.executable, mmdet_train, config, '--work-dir',
         str(tmp_path / 'work')], timeout=300,
        env=dict(TORCH_HOME=torch_home))
    assert not result.timed_out and result.returncode != 0, result
    last = result.output.strip().splitlines()[-1]
    assert 'WeightsUnavailableError' in last and URL in last, result


def test_cached_file_loads_without_network(torch_home):
    from mmengine.runner import CheckpointLoader

    from mmsafe.checkpoint import register_remote_weight_schemes
    register_remote_weight_schemes()  # what SafeRunner does when built
    cached = osp.join(torch_home, 'hub', 'checkpoints', 'resnet50.pth')
    os.makedirs(osp.dirname(cached))
    torch.save({'w': torch.arange(3)}, cached)
    loaded = CheckpointLoader.load_checkpoint(URL, map_location='cpu')
    assert torch.equal(loaded['w'], torch.arange(3))


def test_a_server_that_never_answers_hits_the_download_deadline(
        torch_home, monkeypatch):
    """A blackholed weight server (accepts the connection, never answers):
    the download gives up after MMSAFE_DOWNLOAD_TIMEOUT seconds instead of
    hanging start-up."""
    import socket

    from mmengine.runner import CheckpointLoader

    from mmsafe.checkpoint.remote_weights import WeightsUnavailableError
    from mmsafe.checkpoint.schemes import register_remote_weight_schemes
    register_remote_weight_schemes()
    monkeypatch.setenv('MMSAFE_DOWNLOAD_TIMEOUT', '1')
    with socket.socket() as server:
        server.bind(('127.0.0.1', 0))
        server.listen(1)  # the kernel completes the handshake; no reply
        url = f'http://127.0.0.1:{server.getsockname()[1]}/r50.pth'
        with pytest.raises(WeightsUnavailableError) as info:
            CheckpointLoader.load_checkpoint(url, map_location='cpu')
    message = str(info.value)
    assert url in message and 'timed out' in message, message
    assert 'timeout 1 s' in message, message
    cached = osp.join(torch_home, 'hub', 'checkpoints', 'r50.pth')
    assert cached in message and not osp.exists(cached)
    assert not os.listdir(osp.dirname(cached)), 'partial download left'


def test_two_ranks_fail_together_with_the_same_error(tmp_path, torch_home):
    """DDP (2 gloo processes): rank 0 downloads, rank 1 waits for its
    outcome; every rank stops with the error, none is left waiting.

    Each rank's error is read from the event log, which the rank writes
    before it raises: once rank 0 has exited with its error, torchrun ends
    rank 1, sometimes before rank 1's traceback reaches the console."""
    from mmsafe.events import read_events
    config = pretrained_config(str(tmp_path), str(tmp_path / 'data') + '/')
    work_dir = str(tmp_path / 'work')
    result = run_train(config, nproc=2, timeout=300,
                       args=['--work-dir', work_dir],
                       env=dict(TORCH_HOME=torch_home))
    assert not result.timed_out, result
    assert result.returncode != 0, result
    records = read_events(work_dir, 'rank_failed')
    # one record a rank
    assert sorted(r['rank'] for r in records) == [0, 1], (records, result)
    errors = {r['rank']: r['error'] for r in records}
    for rank, error in errors.items():
        assert error.startswith('WeightsUnavailableError: [mmsafe] '
                                'pretrained weights'), (rank, error)
        assert URL in error, (rank, error)
    # rank 1 did not try again: it reports the outcome of rank 0's download
    assert 'the download failed on rank 0: URLError' in errors[1], errors
    # and the user sees the error on the console
    assert any(URL in line and 'WeightsUnavailableError: [mmsafe] '
               'pretrained weights' in line
               for line in result.output.splitlines()), result


@pytest.fixture
def weight_server(tmp_path):
    """A local HTTP server with one weight file: a machine with network."""
    import functools
    import http.server
    import threading
    folder = tmp_path / 'served'
    folder.mkdir()
    torch.save({'w': torch.arange(4)}, str(folder / 'served.pth'))
    handler = functools.partial(http.server.SimpleHTTPRequestHandler,
                                directory=str(folder))
    server = http.server.ThreadingHTTPServer(('127.0.0.1', 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f'http://127.0.0.1:{server.server_address[1]}/served.pth'
    server.shutdown()
    server.server_close()


def test_reachable_url_is_a_warning_then_downloaded_into_the_cache(
        tmp_path, torch_home, weight_server):
    from mmengine.runner import CheckpointLoader

    config = pretrained_config(str(tmp_path), str(tmp_path / 'data') + '/',
                               checkpoint=weight_server)
    report = _preflight(config, str(tmp_path / 'work'))
    assert not report.find('checkpoint', 'error'), report.format_text()
    warn = [r for r in report.find('checkpoint', 'warn')
            if r.where == 'model.backbone.init_cfg.checkpoint']
    assert warn and 'reachable now' in warn[0].what, report.format_text()
    cached = osp.join(torch_home, 'hub', 'checkpoints', 'served.pth')
    from mmsafe.checkpoint import register_remote_weight_schemes
    register_remote_weight_schemes()
    loaded = CheckpointLoader.load_checkpoint(weight_server,
                                              map_location='cpu')
    assert torch.equal(loaded['w'], torch.arange(4))
    assert os.listdir(osp.dirname(cached)) == ['served.pth']
    report = _preflight(config, str(tmp_path / 'work'))
    assert any(cached in r.what for r in report.find('checkpoint', 'ok'))
