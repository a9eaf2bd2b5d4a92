"""Data roots, annotation files and a sample of image (pairs) exist and open.

The dataset is built the way ``Runner.build_dataloader`` builds it, then a
few items spread over the dataset are opened (visible and infrared image of
a pair) and one item runs through the pipeline. Nothing iterates the whole
dataset: datasets with one annotation file per image (LLVIP, VOC-style
``XMLDataset``) index only the sampled images, through a temporary image
list (``ann_file``); ``full_index=True`` (``--full-index``) builds the whole
index as training does (LLVIP: 12,025 xml files, 5-15 s).
"""
import copy
import os.path as osp
import tempfile
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple

from mmsafe.datasets.loader.inflight_memory import nbytes
from mmsafe.datasets.walk import config_leaves, leaf_datasets
from mmsafe.errors import MMSafeValueError
from ..context import PreflightContext, first_line
from ..data_sample import (is_remote, join_root, sample_indices,
                           sampled_config)
from ..report import CheckRow

NAME = 'data'
# keys of a data info that name image files of a sample
IMAGE_KEYS = ('img_path', 'ir_img_path')


def _top_root_note(root: str, top: Any) -> str:
    """Why an existing top-level ``data_root`` that differs from a
    dataset's did not reach it (empty when it does not apply)."""
    if not isinstance(top, str) or not top or top == root or \
            not osp.isdir(top):
        return ''
    return (f'. The config\'s top-level data_root is {top!r}, which exists: '
            'MMEngine copies a top-level data_root into the datasets when '
            'it reads the file that defines them, so a later one (a child '
            'config\'s, or --cfg-options data_root=...) does not reach '
            'them.')


def _paths_rows(path: str, cfg: Dict,
                top_root: Any = None) -> Tuple[List[CheckRow], bool]:
    """Rows about the files and folders a leaf dataset names; and whether
    the dataset can be built (False: it would only fail on those files).
    ``top_root``: the config's top-level ``data_root``."""
    rows: List[CheckRow] = []
    root = cfg.get('data_root', None)
    synthetic = cfg.get('synthetic', None)
    if root and not is_remote(root, cfg) and not osp.isdir(root):
        if synthetic is not None:
            rows.append(CheckRow(
                'info', NAME, f'data_root {root!r} does not exist yet: the '
                'synthetic dataset is created there on first use.',
                f'{path}.synthetic'))
        else:
            rows.append(CheckRow(
                'error', NAME, f'data_root {root!r} does not exist '
                f'(absolute: {osp.abspath(root)}).', f'{path}.data_root',
                'Put the dataset there, or point the config at it: '
                f'--cfg-options {path}.data_root=/path/to/data' +
                _top_root_note(root, top_root)))
        return rows, False
    ann_file = cfg.get('ann_file', None)
    if isinstance(ann_file, str) and ann_file and \
            not is_remote(ann_file, cfg):
        full = join_root(root, ann_file)
        if not osp.isfile(full):
            rows.append(CheckRow(
                'error', NAME, f'Annotation file {full!r} does not exist.',
                f'{path}.ann_file',
                'Check the file name relative to data_root, or set '
                f'--cfg-options {path}.ann_file=...'))
    prefix = cfg.get('data_prefix', None)
    if isinstance(prefix, dict):
        for key, sub in prefix.items():
            if not isinstance(sub, str) or not sub or is_remote(sub, cfg):
                continue
            full = join_root(root, sub)
            if not osp.isdir(full):
                rows.append(CheckRow(
                    'error', NAME, f'data_prefix[{key!r}] folder {full!r} '
                    'does not exist.', f'{path}.data_prefix.{key}',
                    'Check the folder name relative to data_root (LLVIP: '
                    'visible/train/, infrared/train/, Annotations/).'))
    buildable = not any(r.status == 'error' for r in rows)
    return rows, buildable


def _build(dataset_cfg: Dict, ctx: PreflightContext):
    from mmengine.registry import DefaultScope
    with DefaultScope.overwrite_default_scope(ctx.default_scope):
        dataset = ctx.registry('DATASETS').build(copy.deepcopy(dataset_cfg))
        if hasattr(dataset, 'full_init'):
            dataset.full_init()
    return dataset


def _open_image(path: str, backend_args: Optional[dict]):
    import mmcv
    from mmengine.fileio import get
    img = mmcv.imfrombytes(get(path, backend_args=backend_args),
                           flag='unchanged')
    if img is None:
        raise MMSafeValueError('cannot be decoded as an image')
    return img


def _sample_rows(dataset, where: str, ctx: PreflightContext,
                 backend_args: Optional[dict],
                 listed: Optional[int]) -> Tuple[List[CheckRow], bool]:
    """Open the images of a few items; return rows and whether it is
    paired (its data infos carry ``ir_img_path``)."""
    rows: List[CheckRow] = []
    get_info = getattr(dataset, 'get_data_info', None)
    if get_info is None:
        return [CheckRow('info', NAME, f'{type(dataset).__name__} has no '
                         'get_data_info(): image files not sampled.',
                         where)], False
    paired = False
    problems: List[str] = []
    opened = 0
    indices = sample_indices(len(dataset), ctx.samples)
    for idx in indices:
        info = get_info(idx)
        shapes = {}
        for key in IMAGE_KEYS:
            path = info.get(key, None)
            if path is None:
                continue
            paired = paired or key == 'ir_img_path'
            try:
                img = _open_image(path, backend_args)
                shapes[key] = img.shape[:2]
                opened += 1
            except Exception as err:
                problems.append(f'item {idx}: {key} {path!r}: '
                                f'{first_line(err, 200)}')
        if len(shapes) == 2 and len(set(shapes.values())) > 1:
            problems.append(
                f'item {idx}: visible {info["img_path"]!r} is '
                f'{shapes["img_path"][1]}x{shapes["img_path"][0]} but '
                f'infrared {info["ir_img_path"]!r} is '
                f'{shapes["ir_img_path"][1]}x{shapes["ir_img_path"][0]} '
                '(a pair must share height and width)')
    for problem in problems[:3]:
        rows.append(CheckRow(
            'error', NAME, f'Sampled image cannot be used: {problem}.', where,
            'Replace or remove the file (tools/check_dataset.py CONFIG '
            'audits every item), then run preflight again.'))
    if len(problems) > 3:
        rows.append(CheckRow('error', NAME, f'... and {len(problems) - 3} '
                             'more sampled image problems.', where))
    if not problems:
        kind = 'image pairs' if paired else 'images'
        total = listed if listed is not None else len(dataset)
        rows.append(CheckRow('ok', NAME, f'{len(indices)} sampled {kind} '
                             f'open ({opened} files) out of {total} '
                             'items.', where))
    return rows, paired


def _pipeline_rows(dataset, where: str, paired: bool, ctx: PreflightContext,
                   name: str) -> List[CheckRow]:
    """Run one item through the pipeline (transforms and packing)."""
    start = time.perf_counter()
    try:
        item = dataset[0]
    except Exception as err:
        return [CheckRow(
            'error', NAME, f'The pipeline fails on item 0: '
            f'{type(err).__name__}: {first_line(err)}', f'{where}.pipeline',
            'Fix the transform named in the message (run '
            'tools/check_dataset.py CONFIG for the traceback).')]
    seconds = time.perf_counter() - start
    ctx.state.setdefault('item_bytes', {})[name] = nbytes(item)
    inputs = item.get('inputs', None) if isinstance(item, dict) else None
    if paired and not (isinstance(inputs, dict) and 'infrared' in inputs):
        return [CheckRow(
            'warn', NAME, 'The data infos carry ir_img_path, but the '
            'pipeline output has no infrared input: training would see the '
            'visible modality only.', f'{where}.pipeline',
            'Use LoadPairedImageFromFile and PackPairedDetInputs (mmsafe) '
            'in the pipeline.')]
    if isinstance(inputs, dict) and {'visible', 'infrared'} <= set(inputs):
        vis, ir = inputs['visible'], inputs['infrared']
        if tuple(vis.shape[-2:]) != tuple(ir.shape[-2:]):
            return [CheckRow(
                'error', NAME, f'The pipeline outputs visible '
                f'{tuple(vis.shape)} and infrared {tuple(ir.shape)}: their '
                'geometry differs.', f'{where}.pipeline',
                'Use mmsafe paired transforms for every geometric step.')]
    return [CheckRow('ok', NAME, f'The pipeline runs on item 0 '
                     f'({seconds * 1000:.0f} ms).', f'{where}.pipeline')]


def _annotation_rows(dataset, where: str,
                     sampled: bool) -> Iterator[CheckRow]:
    """What the (sampled) annotation files held: object names that are
    not classes, documented defaults applied (each leaf dataset's
    ``annotation_tally``)."""
    of = 'the sampled' if sampled else 'its'
    for leaf in leaf_datasets(dataset):
        tally = getattr(leaf, 'annotation_tally', None)
        if tally is None:
            continue
        if tally.unknown:
            count = sum(e['count'] for e in tally.unknown.values())
            variants = {n: e['suggestion'] for n, e in tally.unknown.items()
                        if e['suggestion'] is not None}
            fix = 'tools/check_dataset.py CONFIG counts them in every file.'
            if variants:
                fix = (f'Add class_aliases={variants!r} to the dataset to '
                       'read them as those classes; ' + fix)
            yield CheckRow(
                'warn', NAME, f'{count} objects in {of} {tally.files} '
                f'annotation files are {tally.unknown_fate}: their names are '
                'not classes: ' + '; '.join(tally.unknown_lines()) + '.',
                where, fix)
        for field, entry in tally.defaults.items():
            yield CheckRow(
                'info', NAME, f'{field} has no value {entry["count"]} times '
                f'in {of} annotation files: read as its documented default '
                f'{entry["default"]}.', where)


def _config_says_paired(dataset_cfg: Any) -> bool:
    text = repr(dataset_cfg)
    return ('Paired' in text or 'LLVIP' in text or 'ir_img' in text)


def check_data_files(ctx: PreflightContext) -> Iterator[CheckRow]:
    """Check data roots, annotation files and a sample of items."""
    bad = ctx.state.get('registry_bad_sections', set())
    seen: Dict[str, str] = {}
    paired_state: Dict[str, bool] = {}
    lengths: Dict[str, int] = {}
    ctx.state['paired'] = paired_state
    ctx.state['dataset_len'] = lengths
    for name, loader in ctx.dataloaders():
        where = f'{name}.dataset'
        dataset_cfg = loader.get('dataset', None)
        if not isinstance(dataset_cfg, dict):
            yield CheckRow('error', NAME, f'{name} has no dataset dict.',
                           where, 'Add dataset=dict(type=..., ...).')
            continue
        paired_state[name] = _config_says_paired(dataset_cfg)
        key = repr(dataset_cfg)
        if key in seen:
            yield CheckRow('ok', NAME, f'Same dataset as {seen[key]} '
                           '(checked there).', where)
            paired_state[name] = paired_state[seen[key]]
            if seen[key] in lengths:
                lengths[name] = lengths[seen[key]]
            item_bytes = ctx.state.get('item_bytes', {})
            if seen[key] in item_bytes:
                item_bytes[name] = item_bytes[seen[key]]
            continue
        seen[key] = name
        buildable = True
        for leaf_path, leaf in config_leaves(dataset_cfg, where):
            rows, ok = _paths_rows(leaf_path, leaf, ctx.cfg.get('data_root'))
            buildable = buildable and ok
            yield from rows
        if not buildable:
            continue
        if name in bad:
            yield CheckRow('info', NAME, 'Dataset not built: fix the '
                           f'registry errors under {name} first.', where)
            continue
        with tempfile.TemporaryDirectory(prefix='mmsafe_preflight_') as tmp:
            yield from _dataset_rows(name, dataset_cfg, ctx, tmp)


def _dataset_rows(name: str, dataset_cfg: Dict, ctx: PreflightContext,
                  tmpdir: str) -> Iterator[CheckRow]:
    """Build (a sample of) the dataset, open items, run the pipeline."""
    where = f'{name}.dataset'
    start = time.perf_counter()
    listed = None
    try:
        if not ctx.full_index:
            dataset_cfg, listed = sampled_config(dataset_cfg, ctx, tmpdir)
        dataset = _build(dataset_cfg, ctx)
    except Exception as err:
        yield CheckRow(
            'error', NAME, f'The dataset does not build: '
            f'{type(err).__name__}: {first_line(err)}', where,
            'Fix what the message names (missing partner images: add '
            "them, or set on_missing_pair='skip' to drop such samples).")
        return
    seconds = time.perf_counter() - start
    ctx.state['dataset_len'][name] = listed if listed is not None else len(
        dataset)
    if len(dataset) == 0:
        yield CheckRow(
            'warn' if listed else 'error', NAME,
            f'The dataset is empty after filtering'
            f'{" (of the sampled images)" if listed else ""}.', where,
            'Check ann_file / data_prefix and filter_cfg.')
        return
    kind = type(dataset).__name__
    if listed is None:
        what = f'{kind} indexes {len(dataset)} items in {seconds:.1f} s.'
    else:
        what = (f'{kind} lists {listed} images; indexed a sample of '
                f'{len(dataset)} in {seconds:.1f} s (--full-index builds '
                'the whole index, as training does).')
    yield CheckRow('ok', NAME, what, where)
    yield from _annotation_rows(dataset, where, listed is not None)
    backend_args = dataset_cfg.get('backend_args', None)
    rows, paired = _sample_rows(dataset, where, ctx, backend_args, listed)
    ctx.state['paired'][name] = ctx.state['paired'][name] or paired
    yield from rows
    yield from _pipeline_rows(dataset, where, paired, ctx, name)
