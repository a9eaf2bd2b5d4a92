"""Index only a sample of a dataset config, as preflight does.

Datasets with one annotation file per image (LLVIP, VOC-style
``XMLDataset``) read every annotation file when their index is built; a
copy of the config whose leaves list only a few evenly spread images
(a temporary ``ann_file``) builds in a fraction of that time.
"""
import copy
import os
import os.path as osp
from typing import Dict, List, Optional, Tuple

from mmsafe.datasets.walk import config_leaves
from .context import PreflightContext


def join_root(root: Optional[str], path: str) -> str:
    """``path`` below ``root`` unless it is absolute or a URL."""
    if root and not osp.isabs(path) and '://' not in path:
        return osp.join(root, path)
    return path


def is_remote(path: str, dataset_cfg: Dict) -> bool:
    """Whether ``path`` is read through a non-local file backend."""
    backend = (dataset_cfg.get('backend_args') or {}).get('backend', 'local')
    return '://' in str(path) or backend not in ('local', 'disk')


def _per_file_annotations(cls) -> bool:
    """Datasets whose index reads one annotation file per image."""
    try:
        from mmdet.datasets import XMLDataset
    except ImportError:  # pragma: no cover
        XMLDataset = ()
    try:
        from mmsafe.datasets.llvip import LLVIPDataset
    except ImportError:  # pragma: no cover
        LLVIPDataset = ()
    bases = tuple(c for c in (XMLDataset, LLVIPDataset) if c)
    return isinstance(cls, type) and bool(bases) and issubclass(cls, bases)


def _image_list(leaf: Dict) -> List[str]:
    """Lines of the leaf's image list: its ann_file, else (LLVIP's folder
    mode) the file names of its visible image folder."""
    root = leaf.get('data_root', None)
    ann_file = leaf.get('ann_file', None)
    if ann_file:
        with open(join_root(root, ann_file), encoding='utf-8') as f:
            return [line.strip() for line in f if line.strip()]
    prefix = (leaf.get('data_prefix', None) or {}).get('img', '')
    folder = join_root(root, prefix) if prefix else root
    suffixes = tuple(s.lower() for s in leaf.get(
        'img_suffixes', ('.jpg', '.jpeg', '.png', '.bmp')))
    return sorted(e.name for e in os.scandir(folder)
                  if e.is_file() and e.name.lower().endswith(suffixes))


def sampled_config(dataset_cfg: Dict, ctx: PreflightContext,
                   tmpdir: str) -> Tuple[Dict, Optional[int]]:
    """A copy of ``dataset_cfg`` whose per-file-annotation datasets index
    only ``ctx.samples`` images; and how many images they list in all
    (None when nothing was sampled)."""
    cfg = copy.deepcopy(dataset_cfg)
    total, sampled = 0, False
    for _, node in config_leaves(cfg):
        cls = node.get('type', None)
        if isinstance(cls, str):
            cls = ctx.lookup('DATASETS', cls)
        if not _per_file_annotations(cls) or is_remote(
                node.get('data_root', '') or '', node):
            continue
        names = _image_list(node)
        picked = [names[i] for i in sample_indices(len(names), ctx.samples)]
        path = osp.join(tmpdir, f'sample_{len(os.listdir(tmpdir))}.txt')
        with open(path, 'w', encoding='utf-8') as f:
            f.write('\n'.join(picked) + '\n')
        node['ann_file'] = path
        total += len(names)
        sampled = True
    return cfg, (total if sampled else None)


def sample_indices(length: int, k: int) -> List[int]:
    """``k`` indices spread evenly over ``range(length)``, ends included."""
    if length <= k:
        return list(range(length))
    step = (length - 1) / (k - 1) if k > 1 else 0
    return sorted({int(round(i * step)) for i in range(k)})
