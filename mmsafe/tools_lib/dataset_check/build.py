"""Build a split's dataset as the runner does, recording what refuses to
build (missing partners) and what the config alone shows (one-modality
transforms)."""
import copy
import os
import os.path as osp
from typing import List

from mmsafe.datasets.walk import config_nodes, leaf_datasets
from mmsafe.errors import MMSafeKeyError
from .checks import issue


def dataset_config(cfg, split: str):
    """The dataset config of ``{split}_dataloader``, deep-copied."""
    key = f'{split}_dataloader'
    loader = cfg.get(key)
    if not loader or 'dataset' not in loader:
        raise MMSafeKeyError(f'the config has no {key}.dataset')
    return copy.deepcopy(loader['dataset'])


def _pair_policy_holders(ds_cfg) -> List[dict]:
    """The (possibly nested) dataset configs whose type takes
    ``on_missing_pair``."""
    import inspect
    from mmdet.registry import DATASETS
    holders = []
    for _, node in config_nodes(ds_cfg):
        cls = node.get('type')
        if isinstance(cls, str):
            cls = DATASETS.get(cls)
        for klass in getattr(cls, '__mro__', ()):  # subclasses: **kwargs
            try:
                params = inspect.signature(klass.__init__).parameters
            except (TypeError, ValueError):
                continue
            if 'on_missing_pair' in params:
                holders.append(node)
                break
    return holders


def _missing_in_folders(dataset) -> List[dict]:
    """Every visible image of an LLVIP-style folder pair without its
    infrared twin (the dataset's own error names only the first few)."""
    prefix = getattr(dataset, 'data_prefix', None) or {}
    vis_dir, ir_dir = prefix.get('img'), prefix.get('ir_img')
    if getattr(dataset, 'ann_file', '') or not (vis_dir and ir_dir) or \
            not (osp.isdir(vis_dir) and osp.isdir(ir_dir)):
        return []
    ir_names = set(os.listdir(ir_dir))
    found = []
    for name in sorted(os.listdir(vis_dir)):
        if name not in ir_names and osp.isfile(osp.join(vis_dir, name)):
            ir_path = osp.join(ir_dir, name)
            found.append(dict(
                index=None, img_path=osp.join(vis_dir, name),
                ir_img_path=ir_path, **issue(
                    'missing_partner', f'ir_img_path not found: {ir_path}',
                    'files', path=ir_path)))
    return found


def build_dataset(cfg, split: str):
    """Build the split's dataset as ``Runner.build_dataloader`` does.

    When the dataset refuses to build because partner images are missing
    (``on_missing_pair='error'``, the default), the refusal is recorded as a
    ``missing_partner`` finding and the dataset is built again with
    ``on_missing_pair='skip'`` so that the rest of the data is audited too.

    Returns:
        tuple: ``(dataset, findings)``: findings made while building.
    """
    from mmengine.registry import init_default_scope
    from mmdet.registry import DATASETS
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    ds_cfg = dataset_config(cfg, split)
    findings = []
    try:
        dataset = DATASETS.build(copy.deepcopy(ds_cfg))
    except FileNotFoundError as exc:
        holders = [h for h in _pair_policy_holders(ds_cfg)
                   if h.get('on_missing_pair') != 'skip']
        if not holders or 'pair' not in str(exc):
            raise
        findings.append(dict(index=None, img_path=None, ir_img_path=None,
                             **issue('missing_partner',
                                     f'the dataset refused to build: {exc}',
                                     'dataset')))
        for holder in holders:
            holder['on_missing_pair'] = 'skip'
        dataset = DATASETS.build(ds_cfg)
    if hasattr(dataset, 'full_init'):
        dataset.full_init()
    # A dataset may drop a sample without partner silently (or with a log
    # line that names a few): list every one from the folders themselves.
    listed = [f for leaf in leaf_datasets(dataset)
              for f in _missing_in_folders(leaf)]
    if listed:  # the complete list replaces the dataset's summary line
        findings = [f for f in findings if f['source'] != 'dataset'] + listed
    return dataset, findings


# ------------------------------------------------------ pairing (static)
def static_findings(cfg, split: str) -> List[dict]:
    """Findings from the split's dataset config alone: transforms that
    would move or mix one modality only (see
    :mod:`mmsafe.datasets.pipeline_check`)."""
    from mmengine.registry import init_default_scope
    from mmsafe.datasets.pipeline_check import config_pipeline_problems
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    problems = config_pipeline_problems(dataset_config(cfg, split),
                                        f'{split}_dataloader.dataset')
    return [dict(index=None, img_path=None, ir_img_path=None,
                 **issue('unpaired_transform', p, 'config'))
            for p in problems]
