"""SafeRunner formats the config text once per content: MMEngine's
``Config.pretty_text`` runs yapf at each read (the log, the config dump, the
visualizer, each checkpoint's meta), about 0.5 s a time for a detector's
config. The text read must stay the one MMEngine formats from the config as
it is then."""
import copy
import glob
import os.path as osp
import pickle

import pytest

from tests.engine.ckpt_toys_cfg import TOY_CONFIG


@pytest.fixture
def yapf_runs(monkeypatch):
    """Counts MMEngine's calls of yapf (after mmsafe's import, whose
    dependency check may format a one-line config)."""
    import mmengine.config.config as config_module

    import mmsafe  # noqa: F401
    calls = []
    format_code = config_module.FormatCode

    def counted(*args, **kwargs):
        calls.append(args[0])
        return format_code(*args, **kwargs)
    monkeypatch.setattr(config_module, 'FormatCode', counted)
    return calls


def _toy_config(tmp_path):
    from mmengine.config import Config
    cfg = Config.fromstring(TOY_CONFIG.format(
        max_epochs=2, max_keep=-1, custom_hooks='[]'), '.py')
    cfg.work_dir = str(tmp_path / 'work')
    cfg.runner_type = 'SafeRunner'
    cfg.visualizer = dict(type='Visualizer',
                          vis_backends=[dict(type='LocalVisBackend')])
    return cfg


def _plain_text(cfg):
    """The text MMEngine's own Config formats from ``cfg``'s content."""
    from mmengine.config import Config
    return Config(cfg.to_dict()).pretty_text


def test_a_run_formats_its_config_once_and_stores_mmengine_s_text(
        tmp_path, yapf_runs):
    from mmengine.registry import RUNNERS

    import mmsafe  # noqa: F401  (registers SafeRunner)
    from mmsafe.checkpoint import load_checkpoint_file
    runner = RUNNERS.build(_toy_config(tmp_path))
    runner.train()
    # the log, the dump, the visualizer's copy, the runtime info and two
    # checkpoints read it; MMEngine's Runner formats it each time
    assert len(yapf_runs) == 1, f'{len(yapf_runs)} yapf runs'

    want = _plain_text(runner.cfg)
    work_dir = runner.work_dir
    for name in ('epoch_1.pth', 'epoch_2.pth'):
        meta = load_checkpoint_file(osp.join(work_dir, name),
                                    map_location='cpu')['meta']
        assert meta['cfg'] == want, name
    (dumped, ) = glob.glob(osp.join(work_dir, '*.py'))
    with open(dumped, encoding='utf-8') as f:
        assert f.read() == want
    (vis_config, ) = glob.glob(osp.join(work_dir, '*', 'vis_data',
                                        'config.py'))
    with open(vis_config, encoding='utf-8') as f:
        assert f.read() == want


def test_a_changed_config_is_formatted_again(tmp_path, yapf_runs):
    from mmsafe.engine.runner.config_text import (FormattedOnceConfig,
                                                  formatted_once)
    cfg = _toy_config(tmp_path)
    once = formatted_once(cfg)
    assert isinstance(once, FormattedOnceConfig)
    assert formatted_once(once) is once
    assert formatted_once(None) is None
    assert (once.filename, once.text) == (cfg.filename, cfg.text)

    first = once.pretty_text
    assert once.pretty_text == first == cfg.pretty_text
    assert len(yapf_runs) == 2  # once for `once`, once for plain `cfg`

    once.train_cfg.max_epochs = 5
    once.merge_from_dict({'optim_wrapper.optimizer.lr': 0.5})
    changed = once.pretty_text
    assert changed != first and 'max_epochs=5' in changed
    assert 'lr=0.5' in changed and changed == _plain_text(once)
    assert 'max_epochs=5' not in cfg.pretty_text  # a copy, not a view

    # copies (the Runner deep-copies its config) and pickles still work
    for twin in (copy.deepcopy(once), pickle.loads(pickle.dumps(once))):
        assert isinstance(twin, FormattedOnceConfig)
        assert twin.pretty_text == changed
