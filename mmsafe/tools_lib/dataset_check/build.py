"""Build a split's dataset as the runner does, recording what refuses to
build (missing partners) and what the config alone shows (one-modality
transforms)."""
import copy
import os
import os.path as osp
from typing import List

from mmsafe.datasets.annotation_tally import MalformedAnnotationsError
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


def _pair_policy_holders(ds_cfg,
                        policy: str = 'on_missing_pair') -> List[dict]:
    """The (possibly nested) dataset configs whose type takes ``policy``
    (``on_missing_pair``, ``on_malformed_annotation``)."""
    import inspect
    from mmsafe.registry import DATASETS, resolve
    holders = []
    for _, node in config_nodes(ds_cfg):
        cls = node.get('type')
        if isinstance(cls, str):
            cls = resolve(DATASETS, cls)
        for klass in getattr(cls, '__mro__', ()):  # subclasses: **kwargs
            try:
                params = inspect.signature(klass.__init__).parameters
            except (TypeError, ValueError):
                continue
            if policy in params:
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


def _skipping(ds_cfg, policy: str) -> bool:
    """Set ``policy`` to ``'skip'`` on every dataset config that takes it
    and does not skip yet; whether there was one."""
    holders = [h for h in _pair_policy_holders(ds_cfg, policy)
               if h.get(policy) != 'skip']
    for holder in holders:
        holder[policy] = 'skip'
    return bool(holders)


def build_dataset(cfg, split: str):
    """Build the split's dataset as ``Runner.build_dataloader`` does.

    When the dataset refuses to build because partner images are missing
    (``on_missing_pair='error'``, the default), the refusal is recorded as a
    ``missing_partner`` finding and the dataset is built again with
    ``on_missing_pair='skip'`` so that the rest of the data is audited too.
    Malformed annotation files are audited the same way: the dataset is
    built again with ``on_malformed_annotation='skip'``, and every such
    file is a ``malformed_annotation`` finding (:func:`annotation_findings`).

    Returns:
        tuple: ``(dataset, findings)``: findings made while building.
    """
    from mmengine.registry import init_default_scope
    from mmdet.registry import DATASETS
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    ds_cfg = dataset_config(cfg, split)
    findings = []
    while True:  # each policy is turned into a skip once, else raised
        try:
            dataset = DATASETS.build(copy.deepcopy(ds_cfg))
            break
        except MalformedAnnotationsError:
            if not _skipping(ds_cfg, 'on_malformed_annotation'):
                raise
        except FileNotFoundError as exc:
            if 'pair' not in str(exc) or \
                    not _skipping(ds_cfg, 'on_missing_pair'):
                raise
            findings.append(dict(
                index=None, img_path=None, ir_img_path=None,
                **issue('missing_partner',
                        f'the dataset refused to build: {exc}', 'dataset')))
    if hasattr(dataset, 'full_init'):
        dataset.full_init()
    # A dataset may drop a sample without partner silently (or with a log
    # line that names a few): list every one from the folders themselves.
    listed = [f for leaf in leaf_datasets(dataset)
              for f in _missing_in_folders(leaf)]
    if listed:  # the complete list replaces the dataset's summary line
        findings = [f for f in findings if f['source'] != 'dataset'] + listed
    return dataset, findings + annotation_findings(dataset)


def annotation_findings(dataset) -> List[dict]:
    """Findings from what the leaf datasets met in their annotation files
    (their ``annotation_tally``): each malformed file left out, and each
    object name that is not a class (``class_name_variant`` when it
    matches one but for case or spacing)."""
    found = []
    for leaf in leaf_datasets(dataset):
        tally = getattr(leaf, 'annotation_tally', None)
        if tally is None:
            continue
        owner = tally.owner
        for error in tally.malformed:
            found.append(dict(index=None, img_path=None, ir_img_path=None,
                              **issue('malformed_annotation',
                                      error['message'], 'annotation',
                                      path=error['path'],
                                      element=error['element'],
                                      line=error['line'])))
        for name, entry in tally.unknown.items():
            kind = ('class_name_variant' if entry['suggestion'] is not None
                    else 'unknown_class')
            hint = ('' if entry['suggestion'] is None else
                    f", which differs from {entry['suggestion']!r} only in "
                    'case or spacing: add class_aliases='
                    f"{{{name!r}: {entry['suggestion']!r}}} to the "
                    'dataset to read them as that class')
            found.append(dict(index=None, img_path=None, ir_img_path=None,
                              **issue(kind, f'{owner}: {entry["count"]} '
                                      f'objects named {name!r} '
                                      f'{tally.unknown_fate}{hint}; first: '
                                      f'{", ".join(entry["files"])}',
                                      'annotation', name=name,
                                      count=entry['count'],
                                      files=list(entry['files']),
                                      suggestion=entry['suggestion'],
                                      path=entry['files'][0])))
    return found


def annotation_summary(dataset) -> List[dict]:
    """What each leaf dataset counted in its annotation files (see
    :class:`~mmsafe.datasets.annotation_tally.AnnotationTally`)."""
    return [leaf.annotation_tally.as_dict()
            for leaf in leaf_datasets(dataset)
            if getattr(leaf, 'annotation_tally', None) is not None]


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
