"""Walk dataset wrappers down to the datasets that own samples.

Dataset wrappers nest their inner datasets under ``dataset``
(MMEngine's ``RepeatDataset``, ``ClassBalancedDataset``, MMDetection's
``MultiImageMixDataset``, mmsafe's ``ValidInstanceResampleDataset``) or
``datasets`` (``ConcatDataset``), both in a config and as built objects.
Every part of mmsafe that looks through wrappers (preflight, the dataset
audit behind ``tools/check_dataset.py``, ``DataLoaderProbeHook``) walks them
with the functions here, so a new wrapper needs to be understood in one
place only.

Two forms are walked:

* configs (dicts): :func:`config_children`, :func:`config_nodes`,
  :func:`config_leaves`, each with the config path of every node
  (``train_dataloader.dataset.datasets[1]``) for messages;
* built datasets: :func:`inner_datasets`, :func:`leaf_datasets`,
  :func:`innermost_dataset`, and :func:`resolve_index`, which maps an index
  of the outer dataset to the leaf dataset and index that hold the sample.
"""
from typing import Any, Dict, Iterator, List, Tuple

#: walking stops this deep, so a self-referencing object cannot loop
MAX_DEPTH = 16


# ---------------------------------------------------------------- configs
def config_children(cfg: Any) -> List[Tuple[str, Dict]]:
    """The dataset configs a wrapper config nests, with their path suffix.

    Returns:
        list[tuple[str, dict]]: ``('.dataset', inner)`` and
        ``('.datasets[i]', item)`` for each nested dict, in that order;
        empty for a dataset that is not a wrapper (or not a dict).
    """
    if not isinstance(cfg, dict):
        return []
    children = []
    inner = cfg.get('dataset', None)
    if isinstance(inner, dict):
        children.append(('.dataset', inner))
    many = cfg.get('datasets', None)
    if isinstance(many, (list, tuple)):
        children += [(f'.datasets[{i}]', item) for i, item in enumerate(many)
                     if isinstance(item, dict)]
    return children


def config_nodes(cfg: Any, path: str = 'dataset',
                 _depth: int = 0) -> Iterator[Tuple[str, Dict]]:
    """Every dataset config of ``cfg``, wrappers before what they wrap.

    Args:
        cfg (dict): a dataset config, e.g. ``cfg.train_dataloader.dataset``.
        path (str): the config path of ``cfg``.

    Yields:
        tuple[str, dict]: ``(path, node)``; the nodes are the dicts of
        ``cfg`` itself (not copies), so a caller may edit them in place.
    """
    if not isinstance(cfg, dict) or _depth > MAX_DEPTH:
        return
    yield path, cfg
    for suffix, child in config_children(cfg):
        yield from config_nodes(child, path + suffix, _depth + 1)


def config_leaves(cfg: Any, path: str = 'dataset') -> List[Tuple[str, Dict]]:
    """The dataset configs of ``cfg`` that nest no other (they read files).

    Same arguments and node identity as :func:`config_nodes`.
    """
    return [(p, node) for p, node in config_nodes(cfg, path)
            if not config_children(node)]


# ---------------------------------------------------------- built objects
def inner_datasets(dataset: Any) -> List[Any]:
    """The datasets a built wrapper holds (``.datasets`` or ``.dataset``);
    empty for a dataset that holds no other."""
    many = getattr(dataset, 'datasets', None)
    if isinstance(many, (list, tuple)) and len(many) > 0:
        return list(many)
    inner = getattr(dataset, 'dataset', None)
    if inner is not None and inner is not dataset:
        return [inner]
    return []


def _owns_samples(dataset: Any) -> bool:
    # MMEngine's BaseDataset: it runs its own pipeline on its own files.
    return hasattr(dataset, 'prepare_data') and hasattr(dataset,
                                                        'data_prefix')


def leaf_datasets(dataset: Any, _depth: int = 0) -> List[Any]:
    """The datasets below any wrappers that own samples (read files).

    A dataset that owns samples is a leaf even when it holds another
    dataset; a wrapper that has files of its own (``data_prefix``) is
    listed after its leaves.
    """
    if _owns_samples(dataset) or _depth > MAX_DEPTH:
        return [dataset]
    inner = inner_datasets(dataset)
    if not inner:
        return [dataset]
    leaves = [leaf for d in inner for leaf in leaf_datasets(d, _depth + 1)]
    return leaves + ([dataset] if hasattr(dataset, 'data_prefix') else [])


def innermost_dataset(dataset: Any) -> Any:
    """The first dataset below the wrappers (``dataset`` itself if none)."""
    return leaf_datasets(dataset)[0]


def resolve_index(dataset: Any, index: int) -> Tuple[Any, int]:
    """The dataset and index that hold sample ``index`` of ``dataset``.

    Looks through the wrappers that only re-index: MMEngine's
    ``ConcatDataset``, ``RepeatDataset`` and ``ClassBalancedDataset`` (their
    ``_get_ori_dataset_idx``) and ``ValidInstanceResampleDataset`` (same
    index). A caller can then run the sample's own pipeline with
    ``prepare_data`` instead of the wrapper's ``__getitem__``.

    Returns:
        tuple: ``(dataset, index)``; the dataset has ``prepare_data``, or
        is ``dataset`` itself (and ``index`` unchanged) when a wrapper on
        the way cannot be looked through.
    """
    from mmengine.dataset import (ClassBalancedDataset, ConcatDataset,
                                  RepeatDataset)
    from .valid_instance_resample import ValidInstanceResampleDataset
    current, idx = dataset, index
    for _ in range(MAX_DEPTH):
        if hasattr(current, 'prepare_data'):
            return current, idx
        if isinstance(current, ConcatDataset):
            ds_idx, idx = current._get_ori_dataset_idx(idx)
            current = current.datasets[ds_idx]
        elif isinstance(current, (RepeatDataset, ClassBalancedDataset)):
            idx = current._get_ori_dataset_idx(idx)
            current = current.dataset
        elif isinstance(current, ValidInstanceResampleDataset):
            current = current.dataset
        else:
            break
    return dataset, index


def is_paired_dataset(dataset: Any) -> bool:
    """Whether a built dataset yields visible + infrared pairs: its (or its
    innermost dataset's) class is named ``*Pair*``, or its first data info
    has mmsafe's ``ir_img_path`` (``ir_img``) key."""
    for ds in (dataset, innermost_dataset(dataset)):
        if 'pair' in type(ds).__name__.lower():
            return True
        get_info = getattr(ds, 'get_data_info', None)
        if get_info is None:
            continue
        try:
            info = get_info(0)
        except Exception:  # noqa: BLE001  an empty or lazy dataset: unknown
            continue
        if isinstance(info, dict) and ('ir_img_path' in info
                                       or 'ir_img' in info):
            return True
    return False
