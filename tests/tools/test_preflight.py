"""tools/preflight.py: a healthy config passes, each broken setting gives
its error row (where in the config, how to fix), and the CLI exit status
follows.

The configs are the CPU demo (configs/llvip/demo_cpu.py) pointed at a tiny
synthetic LLVIP tree in a temporary folder; each case breaks one setting of
it the way users do (a typo, a missing file, a corrupt image, a value that
PyTorch or MMEngine rejects only after minutes of start-up).
"""
import io
import json
import os
import os.path as osp
import shutil
import sys
import textwrap

import pytest
import torch

from mmsafe.tools.train import build_cfg
from tests.utils import REPO_ROOT, run_command, write_config

PREFLIGHT = osp.join(REPO_ROOT, 'tools', 'preflight.py')
DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
SYNTHETIC = dict(num_train=6, num_test=4, img_size=(96, 80), seed=0)

pytestmark = pytest.mark.skipif(
    not osp.exists(DEMO), reason='configs/llvip/demo_cpu.py not there yet')


def _load_cli():
    from mmsafe.tools import preflight
    return preflight


@pytest.fixture(scope='module')
def cli():
    return _load_cli()


@pytest.fixture(scope='module')
def llvip_tree(tmp_path_factory):
    """A tiny LLVIP tree (6 train + 4 test pairs of 96x80), made once."""
    from mmsafe.datasets.synthetic_llvip import ensure_synthetic_llvip
    root = str(tmp_path_factory.mktemp('llvip') / 'LLVIP')
    ensure_synthetic_llvip(root, **SYNTHETIC)
    return root


def healthy_config(directory: str, data_root: str, extra: str = '') -> str:
    """The demo config on ``data_root`` (read as real data: no synthetic
    generation), so breaking a file there is seen as a user would see it."""
    return write_config(
        osp.join(directory, 'cfg.py'), textwrap.dedent(f"""
        _base_ = [{DEMO!r}]
        data_root = {data_root + '/'!r}
        train_dataloader = dict(
            batch_size=2,
            dataset=dict(data_root=data_root, synthetic=None))
        val_dataloader = dict(
            batch_size=1,
            dataset=dict(data_root=data_root, synthetic=None))
        test_dataloader = val_dataloader
        train_cfg = dict(max_epochs=1, val_interval=1)
        custom_hooks = []
        """) + textwrap.dedent(extra))


def preflight(cli, config: str, work_dir: str, modify=None, args=(),
              **kwargs):
    """Resolve ``config`` as tools/train.py does, apply ``modify(cfg)`` (the
    broken setting) and run the checks in this process."""
    from mmsafe.preflight import run_preflight
    parsed = cli.parse_args([config, '--work-dir', work_dir, *args])
    cfg = build_cfg(parsed)
    if modify is not None:
        modify(cfg)
    return run_preflight(cfg, parsed.launcher, **kwargs)


def error_rows(report, check):
    return [r for r in report.rows if r.check == check and
            r.status == 'error']


@pytest.fixture
def healthy(tmp_path, llvip_tree):
    return healthy_config(str(tmp_path), llvip_tree)


# ---------------------------------------------------------------------------
# healthy configs
# ---------------------------------------------------------------------------
def test_healthy_config_passes(cli, healthy, tmp_path, capsys):
    code = cli.main([healthy, '--work-dir', str(tmp_path / 'work')])
    out = capsys.readouterr().out
    assert code == 0, out
    assert 'preflight passed' in out
    # every check ran and said something
    for check in ('console', 'registry', 'model', 'data', 'dataloader',
                  'batch', 'amp', 'checkpoint', 'work_dir', 'visualizer',
                  'distributed', 'guards'):
        assert f' {check} ' in out, (check, out)
    assert 'sampled image pairs open' in out
    assert 'The pipeline runs on item 0' in out


def test_demo_config_passes_via_cli_json(tmp_path):
    """The real CLI (``__main__``) on the unmodified demo config."""
    result = run_command(
        [sys.executable, PREFLIGHT, DEMO, '--work-dir',
         str(tmp_path / 'work'), '--json'], timeout=600)
    assert result.returncode == 0, result
    start = result.output.index('{\n')
    report = json.loads(result.output[start:result.output.rindex('}') + 1])
    assert report['ok'] is True and report['counts']['error'] == 0
    # The run's timings are reported (their values belong to benchmarks).
    assert isinstance(report['seconds'], float) and report['timings']


# ---------------------------------------------------------------------------
# broken settings: each gives its error row
# ---------------------------------------------------------------------------
def _set(path, value):
    """A modifier that sets ``cfg.<path>`` (dots; [i] for list items)."""

    def modify(cfg):
        node = cfg
        parts = path.replace('[', '.[').split('.')
        for part in parts[:-1]:
            node = node[int(part[1:-1])] if part.startswith('[') else \
                node[part]
        last = parts[-1]
        if last.startswith('['):
            node[int(last[1:-1])] = value
        else:
            node[last] = value

    return modify


BROKEN = [
    # (id, modifier, check, where, words in `what`)
    ('model-type-typo', _set('model.backbone.type', 'ResNett'), 'registry',
     'model.backbone.type', "Did you mean 'ResNet'"),
    ('transform-typo',
     _set('train_dataloader.dataset.pipeline[2].type', 'PairedResise'),
     'registry', 'train_dataloader.dataset.pipeline[2].type',
     "'PairedResize'"),
    ('hook-typo', _set('custom_hooks', [dict(type='CheckpointHok')]),
     'registry', 'custom_hooks[0].type', "'CheckpointHook'"),
    ('metric-typo', _set('val_evaluator[0].type', 'VOCMetrik'), 'registry',
     'val_evaluator[0].type', "'VOCMetric'"),
    ('optimizer-typo', _set('optim_wrapper.optimizer.type', 'AdamWW'),
     'registry', 'optim_wrapper.optimizer.type', "'AdamW'"),
    ('model-bad-argument', _set('model.backbone.depth', 19), 'model',
     'model', 'invalid depth'),
    ('data-root-missing',
     _set('train_dataloader.dataset.data_root', '/nonexistent/LLVIP/'),
     'data', 'train_dataloader.dataset.data_root', 'does not exist'),
    ('ann-file-missing',
     _set('train_dataloader.dataset.ann_file', 'ImageSets/train.txt'),
     'data', 'train_dataloader.dataset.ann_file', 'does not exist'),
    ('prefix-missing',
     _set('val_dataloader.dataset.data_prefix.img', 'visible/val/'), 'data',
     'val_dataloader.dataset.data_prefix.img', 'does not exist'),
    ('persistent-workers-without-workers',
     _set('train_dataloader.persistent_workers', True), 'dataloader',
     'train_dataloader.persistent_workers', 'num_workers > 0'),
    ('prefetch-without-workers', _set('val_dataloader.prefetch_factor', 2),
     'dataloader', 'val_dataloader.prefetch_factor', 'multiprocessing'),
    ('negative-workers', _set('train_dataloader.num_workers', -1),
     'dataloader', 'train_dataloader.num_workers', 'non-negative'),
    ('loader-memory', lambda cfg: cfg.train_dataloader.update(
        num_workers=2, prefetch_factor=10**7), 'dataloader',
     'train_dataloader.num_workers', 'exhaust memory'),
    ('batch-size-zero', _set('train_dataloader.batch_size', 0), 'batch',
     'train_dataloader.batch_size', 'rounded it down'),
    ('batch-size-float', _set('train_dataloader.batch_size', 0.5), 'batch',
     'train_dataloader.batch_size', 'float'),
    ('accumulative-counts-zero',
     _set('optim_wrapper.accumulative_counts', 0), 'batch',
     'optim_wrapper.accumulative_counts', 'accumulative_counts is 0'),
    # 6 train items / batch 2 x 1 epoch = 3 iterations < 8
    ('accumulative-counts-over-run',
     _set('optim_wrapper.accumulative_counts', 8), 'batch',
     'optim_wrapper.accumulative_counts', '3 training iterations'),
    ('amp-optim-wrapper-on-cpu',
     _set('optim_wrapper.type', 'AmpOptimWrapper'), 'amp',
     'optim_wrapper.type', 'needs a GPU'),
    ('amp-bad-dtype', lambda cfg: cfg.optim_wrapper.update(
        type='AmpNaNSkipOptimWrapper', dtype='float8'), 'amp',
     'optim_wrapper.dtype', 'float8'),
    ('amp-device-type-cuda', lambda cfg: cfg.optim_wrapper.update(
        type='AmpNaNSkipOptimWrapper', device_type='cuda'), 'amp',
     'optim_wrapper.device_type', "device_type='cuda'"),
    ('load-from-missing', _set('load_from', '/nonexistent/epoch_12.pth'),
     'checkpoint', 'load_from', 'does not exist'),
    ('pretrained-missing',
     _set('model.backbone.init_cfg',
          dict(type='Pretrained', checkpoint='/nonexistent/r18.pth')),
     'checkpoint', 'model.backbone.init_cfg.checkpoint', 'does not exist'),
    ('disk-too-small',
     _set('default_hooks.checkpoint.max_keep_ckpts', 10**9), 'work_dir',
     'default_hooks.checkpoint.max_keep_ckpts', 'Not enough disk space'),
    ('tensorboard-backend-unknown',
     _set('visualizer.vis_backends[1].type', 'TensorBoardVisBackend'),
     'registry', 'visualizer.vis_backends[1].type',
     "'TensorboardVisBackend'"),
    ('sync-bn-value', _set('sync_bn', 'apex'), 'distributed', 'sync_bn',
     "'torch' or 'mmcv'"),
]


@pytest.mark.parametrize('modify,check,where,words',
                         [case[1:] for case in BROKEN],
                         ids=[case[0] for case in BROKEN])
def test_broken_setting_gives_its_error_row(cli, healthy, tmp_path, modify,
                                            check, where, words):
    if check == 'amp' and torch.cuda.is_available():
        pytest.skip('AMP errors are about machines without CUDA')
    report = preflight(cli, healthy, str(tmp_path / 'work'), modify)
    rows = error_rows(report, check)
    assert report.has_errors
    assert any(r.where == where and words in r.what and r.fix
               for r in rows), report.format_text()


def test_top_level_data_root_from_cfg_options_is_explained(
        cli, tmp_path, llvip_tree):
    """``--cfg-options data_root=...`` does not move datasets whose
    data_root the config file already filled in: the error says why."""
    config = healthy_config(str(tmp_path), str(tmp_path / 'not_here'))
    report = preflight(cli, config, str(tmp_path / 'work'),
                       args=['--cfg-options', f'data_root={llvip_tree}/'])
    rows = error_rows(report, 'data')
    assert {r.where for r in rows} == {'train_dataloader.dataset.data_root',
                                       'val_dataloader.dataset.data_root'}
    for row in rows:
        assert f"{tmp_path / 'not_here'}/" in row.what, row
        assert f"top-level data_root is '{llvip_tree}/', which exists" in \
            row.fix and '--cfg-options data_root=...) does not reach' in \
            row.fix, row
    # a top-level data_root that is the dataset's own, or does not exist,
    # is not mentioned
    report = preflight(cli, config, str(tmp_path / 'work'))
    assert all('top-level' not in r.fix for r in error_rows(report, 'data'))
    report = preflight(cli, config, str(tmp_path / 'work'), args=[
        '--cfg-options', f"data_root={tmp_path / 'elsewhere'}/"])
    assert all('top-level' not in r.fix for r in error_rows(report, 'data'))


def test_healthy_config_has_none_of_those_rows(cli, healthy, tmp_path):
    report = preflight(cli, healthy, str(tmp_path / 'work'))
    assert not report.has_errors, report.format_text()
    assert report.find('batch', 'ok')[0].what.startswith(
        '2 samples per device x 1 accumulated')


@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU-only behaviour')
def test_amp_flag_on_cpu_passes(cli, healthy, tmp_path):
    """--amp on CPU: tools/train.py picks AmpNaNSkipOptimWrapper, and
    bfloat16 autocast works here."""
    report = preflight(cli, healthy, str(tmp_path / 'work'), args=['--amp'])
    assert not report.has_errors, report.format_text()
    assert report.find('amp', 'ok')[0].what == (
        'AMP on: AmpNaNSkipOptimWrapper, autocast bfloat16 works on cpu.')


def test_guard_summary(cli, healthy, tmp_path):
    def modify(cfg):
        cfg.custom_hooks = [dict(type='DataLoaderProbeHook')]
        cfg.optim_wrapper.type = 'NaNSkipOptimWrapper'

    report = preflight(cli, healthy, str(tmp_path / 'work'), modify)
    on, off = report.find('guards', 'info')
    assert on.what == ('mmsafe guards on: DataLoaderProbeHook, '
                       'NaNSkipOptimWrapper.'), report.format_text()
    assert 'DataLoaderProbeHook' not in off.what
    assert 'HangWatchdogHook' in off.what


MMDET_CONFIGS = [
    'faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',
    'fpg/retinanet_r50_fpg-chn128_crop640_50e_coco.py',  # neck-own names
    'cascade_rpn/cascade-rpn_faster-rcnn_r50-caffe_fpn_1x_coco.py',
    'albu_example/mask-rcnn_r50_fpn_albu-1x_coco.py',  # albumentations
    'soft_teacher/soft-teacher_faster-rcnn_r50-caffe_fpn_180k_semi-0.1-'
    'coco.py',  # a detector inside a wrapper model
    'ddq/ddq-detr-5scale_r50_8xb2-12e_coco.py',  # nms under dqs_cfg
]


@pytest.mark.parametrize('name', MMDET_CONFIGS)
def test_mmdet_configs_have_no_registry_errors(name):
    """No false alarms on MMDetection's own configs (of 397 sampled, only
    the ones that need mmpretrain, which is not installed, and one with a
    real typo, MOTChallengeMetrics, give errors)."""
    import mmdet
    from mmengine.config import Config

    from mmsafe.preflight.checks.registry_types import check_registry_types
    from mmsafe.preflight.context import PreflightContext
    path = osp.join(osp.dirname(mmdet.__file__), '.mim', 'configs', name)
    if not osp.exists(path):
        pytest.skip(f'{name} is not shipped with this mmdet')
    rows = list(check_registry_types(PreflightContext(Config.fromfile(path))))
    assert not [r for r in rows if r.status == 'error'], rows


def test_integer_division_batch_from_config_variables(cli, tmp_path,
                                                      llvip_tree):
    """``max_img_per_gpu // sequence_length`` rounds the batch to 0."""
    config = healthy_config(
        str(tmp_path), llvip_tree, """
        max_img_per_gpu = 2
        sequence_length = 4
        imgs_per_gpu = max_img_per_gpu // sequence_length
        train_dataloader = dict(batch_size=imgs_per_gpu)
        """)
    report = preflight(cli, config, str(tmp_path / 'work'))
    wheres = {r.where for r in error_rows(report, 'batch')}
    assert {'imgs_per_gpu', 'train_dataloader.batch_size'} <= wheres


@pytest.fixture
def own_tree(tmp_path, llvip_tree):
    """A private copy of the tree that a test may break."""
    root = str(tmp_path / 'LLVIP')
    shutil.copytree(llvip_tree, root)
    return root


def _first(folder):
    return osp.join(folder, sorted(os.listdir(folder))[0])


def test_missing_infrared_partner(cli, tmp_path, own_tree):
    os.remove(_first(osp.join(own_tree, 'infrared', 'train')))
    config = healthy_config(str(tmp_path), own_tree)
    report = preflight(cli, config, str(tmp_path / 'work'))
    rows = error_rows(report, 'data')
    assert any(r.where == 'train_dataloader.dataset' and
               'does not build' in r.what and 'infrared' in r.what
               for r in rows), report.format_text()


def test_full_index_finds_what_the_sample_skips(cli, tmp_path, own_tree):
    """By default LLVIP indexes only the sampled images (items 0, 2, 3, 5
    of 6); --full-index builds the whole index as training does."""
    folder = osp.join(own_tree, 'infrared', 'train')
    os.remove(osp.join(folder, sorted(os.listdir(folder))[1]))
    config = healthy_config(str(tmp_path), own_tree)
    report = preflight(cli, config, str(tmp_path / 'work'))
    assert not error_rows(report, 'data'), report.format_text()
    assert 'indexed a sample of 4' in report.find('data', 'ok')[0].what
    report = preflight(cli, config, str(tmp_path / 'work'),
                       args=['--full-index'], full_index=True)
    assert any('does not build' in r.what and 'infrared' in r.what
               for r in error_rows(report, 'data')), report.format_text()


def test_corrupt_visible_image(cli, tmp_path, own_tree):
    path = _first(osp.join(own_tree, 'visible', 'train'))
    with open(path, 'wb') as f:
        f.write(b'not a jpeg at all')
    config = healthy_config(str(tmp_path), own_tree)
    report = preflight(cli, config, str(tmp_path / 'work'))
    rows = error_rows(report, 'data')
    assert any('cannot be decoded' in r.what and osp.basename(path) in r.what
               for r in rows), report.format_text()


def test_pair_size_mismatch(cli, tmp_path, own_tree):
    import cv2
    import numpy as np
    path = _first(osp.join(own_tree, 'infrared', 'test'))
    cv2.imwrite(path, np.zeros((40, 50, 3), np.uint8))
    config = healthy_config(str(tmp_path), own_tree)
    report = preflight(cli, config, str(tmp_path / 'work'))
    rows = error_rows(report, 'data')
    assert any(r.where == 'val_dataloader.dataset' and
               'must share height and width' in r.what
               for r in rows), report.format_text()


def test_unknown_class_names_in_the_sampled_files(cli, tmp_path, own_tree):
    """Names that differ from a class only in case are counted in the
    sampled annotation files, with the alias that reads them; a missing
    <difficult> reads 0, counted."""
    import glob
    for path in glob.glob(osp.join(own_tree, 'Annotations', '*.xml')):
        with open(path) as f:
            text = f.read()
        person = ('<object><name>Person</name><bndbox><xmin>2</xmin><ymin>2'
                  '</ymin><xmax>9</xmax><ymax>9</ymax></bndbox></object>')
        with open(path, 'w') as f:
            f.write(text.replace('</annotation>', person + '</annotation>')
                    .replace('<difficult>0</difficult>', ''))
    config = healthy_config(str(tmp_path), own_tree)
    report = preflight(cli, config, str(tmp_path / 'work'))
    warn = [r for r in report.find('data', 'warn')
            if r.where == 'train_dataloader.dataset']
    assert warn and 'dropped: their names are not classes' in warn[0].what \
        and "'Person' x" in warn[0].what, report.format_text()
    assert "class_aliases={'Person': 'person'}" in warn[0].fix
    info = [r for r in report.find('data', 'info')
            if '<difficult> has no value' in r.what]
    assert info and 'read as its documented default 0' in info[0].what


def _save(path, obj):
    torch.save(obj, path)
    return str(path)


def test_load_from_with_untrusted_object(cli, healthy, tmp_path):
    import argparse
    ckpt = _save(tmp_path / 'evil.pth',
                 dict(state_dict={}, extra=argparse.Namespace(a=1)))
    report = preflight(cli, healthy, str(tmp_path / 'work'),
                       _set('load_from', ckpt))
    rows = error_rows(report, 'checkpoint')
    assert any('does not load safely' in r.what and
               'argparse.Namespace' in r.what and
               'mmsafe_trusted_globals' in r.fix for r in rows), \
        report.format_text()


def test_load_from_of_another_model_and_resume_without_state(
        cli, healthy, tmp_path):
    ckpt = _save(tmp_path / 'other.pth',
                 dict(state_dict={'head.weight': torch.zeros(2, 2)}))
    report = preflight(cli, healthy, str(tmp_path / 'work'),
                       args=['--resume', ckpt])
    rows = error_rows(report, 'checkpoint')
    # --resume PATH puts PATH in load_from, with resume=True
    assert any(r.where == 'load_from' and 'cannot be resumed' in r.what
               for r in rows), report.format_text()
    report = preflight(cli, healthy, str(tmp_path / 'work'),
                       _set('load_from', ckpt))
    warn = report.find('checkpoint', 'warn')
    assert any('belongs to another model' in r.what for r in warn), \
        report.format_text()


def test_load_from_of_this_model_passes(cli, healthy, tmp_path):
    from mmengine.config import Config
    from mmengine.registry import DefaultScope
    from mmdet.registry import MODELS
    with DefaultScope.overwrite_default_scope('mmsafe'):
        model = MODELS.build(Config.fromfile(healthy).model)
    ckpt = _save(tmp_path / 'mine.pth', dict(
        meta=dict(epoch=1, iter=3), state_dict=model.state_dict()))
    report = preflight(cli, healthy, str(tmp_path / 'work'),
                       args=['--resume', ckpt])
    assert not report.has_errors, report.format_text()
    assert any('loads with weights_only=True' in r.what
               for r in report.find('checkpoint', 'ok'))


def test_work_dir_not_writable(cli, healthy, tmp_path):
    blocker = tmp_path / 'a_file'
    blocker.write_text('x')
    report = preflight(cli, healthy, str(blocker / 'work'))
    rows = error_rows(report, 'work_dir')
    assert any(r.where == 'work_dir' and 'cannot be created' in r.what
               for r in rows), report.format_text()


def test_tensorboard_not_importable(cli, healthy, tmp_path, monkeypatch):
    # None in sys.modules makes `import torch.utils.tensorboard` fail, as
    # on a machine without the tensorboard package.
    monkeypatch.setitem(sys.modules, 'torch.utils.tensorboard', None)
    report = preflight(cli, healthy, str(tmp_path / 'work'))
    rows = error_rows(report, 'visualizer')
    assert any(r.where == 'visualizer.vis_backends[1]' and
               'pip install tensorboard' in r.fix for r in rows), \
        report.format_text()


@pytest.mark.skipif(torch.cuda.is_available(), reason='CPU-only behaviour')
def test_sync_bn_for_the_launcher(cli, healthy, tmp_path):
    sync = _set('model.backbone.norm_cfg', dict(type='SyncBN'))
    report = preflight(cli, healthy, str(tmp_path / 'work'), sync,
                       args=['--launcher', 'pytorch'])
    rows = error_rows(report, 'distributed')
    assert any(r.where == 'model.backbone.norm_cfg.type' and
               'expected input tensor to be on GPU' in r.what
               for r in rows), report.format_text()
    report = preflight(cli, healthy, str(tmp_path / 'work'), sync)
    assert not error_rows(report, 'distributed')
    assert any('reverts it to BN' in r.what
               for r in report.find('distributed', 'warn'))


def test_find_unused_parameters_without_ddp_is_a_note(cli, healthy,
                                                      tmp_path):
    report = preflight(cli, healthy, str(tmp_path / 'work'),
                       _set('find_unused_parameters', True))
    assert not report.has_errors
    assert any('no effect without DDP' in r.what
               for r in report.find('distributed', 'info'))


def test_torchrun_without_launcher(cli, healthy, tmp_path, monkeypatch):
    monkeypatch.setenv('WORLD_SIZE', '2')
    report = preflight(cli, healthy, str(tmp_path / 'work'))
    assert any('--launcher pytorch' in r.fix
               for r in error_rows(report, 'distributed'))


def _workers(cfg):
    cfg.train_dataloader.num_workers = 2
    cfg.train_dataloader.persistent_workers = True


@pytest.mark.parametrize('system,mp_method', [('Windows', 'fork'),
                                              ('Linux', 'spawn')])
def test_spawn_with_paired_workers_gets_deadlock_advice(
        cli, healthy, tmp_path, system, mp_method):
    def modify(cfg):
        _workers(cfg)
        cfg.env_cfg.mp_cfg.mp_start_method = mp_method

    report = preflight(cli, healthy, str(tmp_path / 'work'), modify,
                       system=system)
    warn = [r for r in report.find('dataloader', 'warn')
            if r.where == 'train_dataloader.num_workers']
    assert warn and 'deadlocked' in warn[0].what, report.format_text()
    assert 'num_workers=0' in warn[0].fix and \
        'persistent_workers=False' in warn[0].fix and \
        'DataLoaderProbeHook' in warn[0].fix
    # fork on Linux: no advice
    report = preflight(cli, healthy, str(tmp_path / 'work'), _workers,
                       system='Linux')
    assert not report.find('dataloader', 'warn')


@pytest.mark.parametrize('runner_type', ['SafeRunner', 'Runner'])
def test_loader_probe_promised_only_where_the_loop_gets_it(
        cli, healthy, tmp_path, runner_type):
    """IterBasedTrainLoop starts its workers when it is built: the probe
    acts first only when SafeRunner builds mmsafe's loop in its place."""
    def modify(cfg):
        _workers(cfg)
        cfg.train_cfg = dict(type='IterBasedTrainLoop', max_iters=4,
                             val_interval=4)
        cfg.custom_hooks = [dict(type='DataLoaderProbeHook')]
        cfg.runner_type = runner_type

    report = preflight(cli, healthy, str(tmp_path / 'work'), modify,
                       system='Windows')
    rows = [r for r in report.rows if r.check == 'dataloader' and
            r.where == 'train_dataloader.num_workers']
    if runner_type == 'SafeRunner':
        assert [r.status for r in rows] == ['info'], report.format_text()
        assert 'DataLoaderProbeHook probes them before IterBasedTrainLoop ' \
            'starts its workers' in rows[0].what
    else:
        assert [r.status for r in rows] == ['warn'], report.format_text()
        assert "IterBasedTrainLoop starts its loader's workers when it is " \
            "built, before DataLoaderProbeHook's before_train" in rows[0].what
        assert "runner_type='SafeRunner'" in rows[0].fix


def test_console_that_cannot_print_the_config(cli, tmp_path, llvip_tree,
                                              monkeypatch):
    config = healthy_config(str(tmp_path), llvip_tree,
                            "\n# classes: ('行人',) = person\n")
    cp1252 = io.TextIOWrapper(io.BytesIO(), encoding='cp1252')
    monkeypatch.setattr(sys, 'stdout', cp1252)
    report = preflight(cli, config, str(tmp_path / 'work'))
    rows = error_rows(report, 'console')
    assert rows and 'cp1252' in rows[0].what and 'U+884C' in rows[0].what
    assert 'PYTHONUTF8=1' in rows[0].fix
    # printing the report itself never fails on that console
    report.print(cp1252)


def test_console_check_reads_the_logged_config_dump(cli, tmp_path,
                                                    llvip_tree, monkeypatch):
    """A character only in the merged config (here from --cfg-options, in
    neither the file nor work_dir) is found, on the line of the dump the
    Runner logs; a healthy config gives the ok row."""
    config = healthy_config(str(tmp_path), llvip_tree)
    work_dir = str(tmp_path / 'work')
    args = ['--cfg-options', 'train_dataloader.dataset.note=Fußgänger']
    parsed = cli.parse_args([config, '--work-dir', work_dir, *args])
    logged = build_cfg(parsed).pretty_text
    line = logged[:logged.index('ß')].count('\n') + 1
    ascii_console = io.TextIOWrapper(io.BytesIO(), encoding='ascii')
    monkeypatch.setattr(sys, 'stdout', ascii_console)
    report = preflight(cli, config, work_dir, args=args)
    rows = error_rows(report, 'console')
    assert rows, report.format_text()
    assert f'U+00DF) on line {line} of the config dump' in rows[0].what
    healthy_report = preflight(cli, config, work_dir)
    assert error_rows(healthy_report, 'console') == []
    assert healthy_report.find('console', 'ok')


def test_cli_exit_status_and_console_encoding(tmp_path, llvip_tree):
    """The real CLI with an ASCII console: exit 1 and the console row."""
    config = healthy_config(str(tmp_path), llvip_tree,
                            "\n# Fußgänger = person\n")
    result = run_command(
        [sys.executable, PREFLIGHT, config, '--work-dir',
         str(tmp_path / 'work'), '--skip', 'data', 'model', 'work_dir'],
        timeout=600, env=dict(PYTHONIOENCODING='ascii', PYTHONUTF8='0'))
    assert result.returncode == 1, result
    assert 'ERROR   console' in result.output
    assert 'U+00DF' in result.output


def test_config_that_does_not_load(cli, tmp_path, capsys):
    config = write_config(str(tmp_path / 'bad.py'),
                          "_base_ = ['./no_such_base.py']\n")
    code = cli.main([config, '--json'])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report['ok'] is False
    assert report['rows'][0]['check'] == 'config'
    assert 'no_such_base' in report['rows'][0]['what']


def test_a_failing_check_is_an_error_not_swallowed(cli, healthy, tmp_path,
                                                   monkeypatch):
    from mmsafe.preflight import runner

    def broken_check(ctx):
        raise RuntimeError('boom')
        yield  # pragma: no cover

    monkeypatch.setattr(runner, 'CHECKS', [('broken', broken_check)])
    report = preflight(cli, healthy, str(tmp_path / 'work'))
    assert report.has_errors
    assert report.rows[0].check == 'broken' and 'boom' in report.rows[0].what
    assert '--skip broken' in report.rows[0].fix


def test_gate_refuses_on_errors(healthy, tmp_path, capsys):
    from mmengine.config import Config

    from mmsafe.preflight import preflight_gate
    cfg = Config.fromfile(healthy)
    cfg.work_dir = str(tmp_path / 'work')
    cfg.train_dataloader.persistent_workers = True
    with pytest.raises(SystemExit, match='training was not started'):
        preflight_gate(cfg, 'none')
    out = ' '.join(capsys.readouterr().out.split())  # the table wraps
    assert 'persistent_workers option needs' in out
    report = preflight_gate(cfg, 'none', strict=False)
    assert report.has_errors


# ---------------------------------------------------------------------------
# pairing: a transform that moves one modality only
# ---------------------------------------------------------------------------
@pytest.mark.parametrize('option,fix', [
    ('train_dataloader.dataset.pipeline.3.type=RandomFlip',
     'PairedRandomFlip'),
    ('train_dataloader.dataset.pipeline.2.type=Resize', 'PairedResize'),
])
def test_one_modality_geometric_transform_is_an_error(cli, healthy,
                                                      tmp_path, capsys,
                                                      option, fix):
    """Put in through --cfg-options as a user would: the pairing row names
    the config path of the step and the paired transform to use."""
    code = cli.main([healthy, '--work-dir', str(tmp_path / 'work'),
                     '--cfg-options', option])
    out = capsys.readouterr().out
    assert code != 0, out
    rows = [line for line in out.splitlines() if ' pairing ' in line]
    assert rows and rows[0].startswith('ERROR'), out
    assert 'train_dataloader.dataset.pipeline[' in out and fix in out, out


def test_healthy_config_has_a_pairing_ok_row(cli, healthy, tmp_path):
    report = preflight(cli, healthy, str(tmp_path / 'work'))
    rows = [r for r in report.rows if r.check == 'pairing']
    assert [r.status for r in rows] == ['ok'], rows
