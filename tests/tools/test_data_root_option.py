"""``--cfg-options data_root=...`` (tools/train.py, tools/test.py,
tools/preflight.py): MMEngine fills a config file's top-level
``data_root`` into the datasets when it reads the file, so a later
top-level value moves no dataset. mmsafe's tools say so, name the
datasets' own keys and change nothing."""
import os.path as osp

from mmengine.config import Config
from mmsafe.tools_lib.cli import load_config, warn_unreached_data_root

from tests.utils import REPO_ROOT, logged_messages

DEMO = osp.join(REPO_ROOT, 'configs', 'llvip', 'demo_cpu.py')
DEMO_ROOT = 'data/llvip_synthetic_demo/'


def logged(fn, *args):
    with logged_messages() as messages:
        out = fn(*args)
    return out, [m for m in messages if 'sets the top-level data_root' in m]


def test_top_level_data_root_option_is_explained_and_changes_nothing(
        tmp_path):
    new = str(tmp_path) + '/'
    cfg, said = logged(load_config, DEMO, 'none', {'data_root': new}, None)
    assert cfg.data_root == new
    for name in ('train', 'val', 'test'):  # as the file filled them in
        assert cfg[f'{name}_dataloader'].dataset.data_root == DEMO_ROOT
    assert len(said) == 1, said
    assert said[0].startswith(f'[mmsafe] --cfg-options data_root={new!r} ')
    for name in ('train', 'val', 'test'):
        assert f"{name}_dataloader.dataset.data_root='{DEMO_ROOT}'" in \
            said[0]
    assert said[0].endswith(
        f'To move them: --cfg-options train_dataloader.dataset.data_root='
        f'{new} val_dataloader.dataset.data_root={new} '
        f'test_dataloader.dataset.data_root={new}'), said[0]


def test_no_warning_when_the_datasets_are_moved_too(tmp_path):
    new = str(tmp_path) + '/'
    options = {'data_root': new}
    options.update({f'{name}_dataloader.dataset.data_root': new
                    for name in ('train', 'val', 'test')})
    cfg, said = logged(load_config, DEMO, 'none', options, None)
    assert cfg.train_dataloader.dataset.data_root == new and said == []
    # no data_root option at all: nothing to say
    _, said = logged(load_config, DEMO, 'none', {'train_cfg.max_epochs': 1},
                     None)
    assert said == []


def test_datasets_inside_wrappers_are_named():
    cfg = Config(dict(
        data_root='/new/',
        train_dataloader=dict(dataset=dict(
            type='ConcatDataset', datasets=[
                dict(type='LLVIPDataset', data_root='/new/'),
                dict(type='RepeatDataset', times=2, dataset=dict(
                    type='LLVIPDataset', data_root='/old/'))]))))
    stale, said = logged(warn_unreached_data_root, cfg,
                         {'data_root': '/new/'})
    assert stale == ["train_dataloader.dataset.datasets[1].dataset."
                     "data_root='/old/'"], stale
    assert len(said) == 1


def test_check_dataset_says_it_too(tmp_path):
    """tools/check_dataset.py (where users first point a config at their
    data) warns the same way before it reports the missing folder."""
    import textwrap

    from mmsafe.tools import check_dataset as tool
    config = tmp_path / 'cfg.py'
    config.write_text(textwrap.dedent(f"""
        data_root = {str(tmp_path / 'in_the_file') + '/'!r}
        train_dataloader = dict(batch_size=1, dataset=dict(
            type='LLVIPDataset', data_root=data_root, pipeline=[]))
        """))
    new = str(tmp_path / 'given') + '/'
    code, said = logged(tool.main, [str(config), '--split', 'train',
                                    '--no-progress', '--cfg-options',
                                    f'data_root={new}'])
    assert code != 0  # the file's root does not exist
    assert len(said) == 1 and (
        "train_dataloader.dataset.data_root="
        f"'{tmp_path / 'in_the_file'}/'") in said[0], said
