"""Per-modality, per-channel mean and std of a paired dataset's images.

The engine of ``tools/check_dataset.py CONFIG --stats``. Every image is read
as the config's loading transform reads it (its ``color_type`` /
``ir_color_type``, decode backend and file backend, and its
``reduced_decode``: JPEGs decoded at the same 1/2, 1/4 or 1/8, one
reduction per pair), before any normalisation, in DataLoader worker
processes. Each worker returns the
per-channel pixel count, sum and sum of squares of one pair as exact
integers; the main process adds them up (streaming: memory does not grow
with the dataset). Every pixel counts once, so images of different sizes
are weighted by their area. The standard deviation is the population one
(``numpy.std``).

Each modality's bit depth (from each file's header, as the loader reads
it) and value range (the smallest and largest stored value of its files)
are reported too. A file of more than 8 bits per channel is read with its
full depth and, when the loading transform has a ``high_depth`` rule,
mapped by it (:mod:`mmsafe.datasets.transforms.bit_depth`), so the mean
and std are those the preprocessor receives; without a rule the loader
refuses such files, and the statistics are of the raw counts, with the
range a ``high_depth=dict(rule='fixed', low=..., high=...)`` keeps.

The result is printed as the lines of ``PairedDetDataPreprocessor``. Its
``mean`` and ``std`` apply after the optional BGR -> RGB swap, so with
``bgr_to_rgb=True`` the channels are given in RGB order.
"""
import copy
import json
import os
import os.path as osp
import time
from typing import Dict, List, Optional, Sequence

import numpy as np
from torch.utils.data import DataLoader, Dataset

from mmsafe.datasets.walk import config_nodes
from mmsafe.errors import MMSafeOSError, MMSafeValueError
from .dataset_check import dataset_config

MODALITIES = ('visible', 'infrared')


def loading_settings(dataset_cfg: dict) -> dict:
    """How the pipeline's first loading transform reads images.

    Returns:
        dict: ``visible`` and ``infrared`` decode flags, ``imdecode_backend``,
        ``backend_args``, ``reduced_decode`` and ``high_depth``
        (normalised, or None).
    """
    from mmsafe.datasets.transforms.bit_depth import check_high_depth_cfg
    from mmsafe.datasets.transforms.reduced_jpeg_decode import \
        check_reduced_decode_cfg
    # the first pipeline, outermost first: it may sit on a wrapper
    pipeline = next((node['pipeline'] for _, node in config_nodes(dataset_cfg)
                     if node.get('pipeline')), [])
    load = next((t for t in pipeline if isinstance(t, dict) and
                 'Load' in str(t.get('type', '')) and
                 'Image' in str(t.get('type', ''))), {})
    flags = (load.get('color_type', 'color'),
             load.get('ir_color_type', 'color'))
    backend = load.get('imdecode_backend', 'cv2')
    return dict(
        visible=flags[0], infrared=flags[1], imdecode_backend=backend,
        backend_args=load.get('backend_args', None),
        reduced_decode=check_reduced_decode_cfg(
            load.get('reduced_decode', None), 'dataset_stats', flags,
            backend),
        high_depth=check_high_depth_cfg(load.get('high_depth', None),
                                        'dataset_stats'))


class PairSumsDataset(Dataset):
    """Pixel count, sum and sum of squares per channel of each pair.

    Args:
        pairs (list[tuple[str, str]]): ``(visible, infrared)`` paths.
        settings (dict): see :func:`loading_settings`.
    """

    def __init__(self, pairs: Sequence[tuple], settings: dict) -> None:
        self.pairs = list(pairs)
        self.settings = settings

    def __len__(self) -> int:
        return len(self.pairs)

    def _sums(self, path: str, img_bytes: bytes, flag: str,
              reduction: int) -> dict:
        """Pixel count, per-channel sum and sum of squares of one image as
        loaded; its bit depth and stored range."""
        from mmsafe.datasets.transforms.bit_depth import (file_bit_depth,
                                                          normalise,
                                                          read_high_depth)
        from mmsafe.datasets.transforms.reduced_jpeg_decode import decode
        bits = file_bit_depth(img_bytes)
        if bits > 8:
            img = read_high_depth(img_bytes, flag)
        else:
            img, _ = decode(img_bytes, flag, reduction, 'dataset_stats',
                            path, self.settings['imdecode_backend'])
        if img is None:
            raise MMSafeOSError(f'dataset_stats: cannot decode {path}')
        low, high = float(img.min()), float(img.max())
        rule = self.settings.get('high_depth')
        if bits > 8 and rule is None and flag.startswith('unchanged'):
            rule = dict(rule='raw')
        refused = bits > 8 and rule is None
        if bits > 8 and rule is not None:
            img = normalise(img, rule)[0]
        if bits > 8 and img.ndim == 2 and flag.startswith('color'):
            # a grey file, 3 channels as the loader gives them
            img = np.repeat(img[..., None], 3, axis=2)
        pixels = img.reshape(-1, 1 if img.ndim == 2 else img.shape[2])
        # integers sum exactly; mapped (float) values in float64
        pixels = pixels.astype(np.float64 if img.dtype.kind == 'f' else
                               np.int64)
        return dict(count=pixels.shape[0], sum=pixels.sum(0),
                    sumsq=(pixels * pixels).sum(0), bits=bits, min=low,
                    max=high, refused=refused)

    def __getitem__(self, idx: int) -> dict:
        from mmengine import fileio

        from mmsafe.datasets.transforms.reduced_jpeg_decode import (
            image_size, pair_reduction)
        paths = dict(zip(MODALITIES, self.pairs[idx]))
        data = {m: fileio.get(p, backend_args=self.settings['backend_args'])
                for m, p in paths.items()}
        reduced = self.settings.get('reduced_decode')
        # one reduction for both images, as the paired loader chooses it
        reduction = 1 if reduced is None else pair_reduction(
            [image_size(b) for b in data.values()], reduced)
        return {m: self._sums(paths[m], data[m], self.settings[m], reduction)
                for m in MODALITIES}


def _identity(x):
    return x


def sample_indices(total: int, samples: Optional[int]) -> List[int]:
    """All indices, or ``samples`` evenly spaced ones (deterministic)."""
    if not samples or samples >= total:
        return list(range(total))
    return sorted(set(np.linspace(0, total - 1, samples).round().astype(
        int).tolist()))


def pair_paths(dataset, indices: Sequence[int]) -> List[tuple]:
    """``(img_path, ir_img_path)`` of the samples ``indices``."""
    pairs = []
    for idx in indices:
        info = dataset.get_data_info(idx)
        if not info.get('ir_img_path'):
            raise MMSafeValueError(
                f'dataset_stats: sample {idx} ({info.get("img_path")}) has '
                'no ir_img_path: the dataset is not paired')
        pairs.append((info['img_path'], info['ir_img_path']))
    return pairs


def compute_stats(pairs: Sequence[tuple], settings: dict, workers: int = 2,
                  progress: bool = True) -> Dict[str, dict]:
    """Per-channel mean and std of each modality over ``pairs``.

    Returns:
        dict: per modality ``mean``, ``std`` (lists, channels as loaded,
        i.e. BGR for colour images), ``pixels``, ``channels``, ``bits``
        (the bit depths of its files), ``range`` (their smallest and
        largest stored value) and ``refused`` (files of more than 8 bits
        the loader refuses without a ``high_depth`` rule); plus ``pairs``
        and ``seconds``.
    """
    loader = DataLoader(
        PairSumsDataset(pairs, settings), batch_size=None, shuffle=False,
        num_workers=workers, collate_fn=_identity,
        prefetch_factor=4 if workers > 0 else None)
    totals = {m: None for m in MODALITIES}
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=len(pairs), unit='pair', dynamic_ncols=True,
                   desc='check_dataset --stats')
    start = time.perf_counter()
    for item in loader:
        for m in MODALITIES:
            part = item[m]
            if totals[m] is None:
                totals[m] = dict(count=0, sum=np.zeros_like(part['sum']),
                                 sumsq=np.zeros_like(part['sumsq']),
                                 bits=set(), min=part['min'],
                                 max=part['max'], refused=0)
            elif len(part['sum']) != len(totals[m]['sum']):
                raise MMSafeValueError(
                    f'dataset_stats: {m} images have '
                    f"{len(totals[m]['sum'])} and {len(part['sum'])} "
                    'channels; one loading flag must fit them all')
            total = totals[m]
            total['count'] += part['count']
            total['sum'] = total['sum'] + part['sum']
            total['sumsq'] = total['sumsq'] + part['sumsq']
            total['bits'].add(part['bits'])
            total['min'] = min(total['min'], part['min'])
            total['max'] = max(total['max'], part['max'])
            total['refused'] += int(part['refused'])
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    if not pairs:
        raise MMSafeValueError('dataset_stats: the dataset has no samples')
    result: Dict[str, dict] = {}
    for m in MODALITIES:
        total = totals[m]
        count = total['count']
        mean = total['sum'] / count
        var = np.maximum(total['sumsq'] / count - mean * mean, 0.0)
        result[m] = dict(mean=mean.tolist(), std=np.sqrt(var).tolist(),
                         pixels=int(count), channels=len(mean),
                         bits=sorted(total['bits']),
                         range=[total['min'], total['max']],
                         refused=total['refused'])
    result['pairs'] = len(pairs)
    result['seconds'] = time.perf_counter() - start
    return result


def _preprocessor_cfg(cfg) -> dict:
    model = cfg.get('model', None) or {}
    return model.get('data_preprocessor', None) or {}


def preprocessor_lines(stats: dict, cfg=None) -> str:
    """The ``PairedDetDataPreprocessor`` lines for ``stats``.

    ``bgr_to_rgb`` is taken from the config's preprocessor for each
    modality (default: True for 3-channel images); with it, the channels
    are written in RGB order.
    """
    pre = _preprocessor_cfg(cfg) if cfg is not None else {}
    lines = ['model = dict(', '    data_preprocessor=dict(']
    for m in MODALITIES:
        channels = stats[m]['channels']
        swap = (pre.get(m, None) or {}).get('bgr_to_rgb', channels == 3)
        swap = bool(swap) and channels == 3
        order = slice(None, None, -1) if swap else slice(None)
        mean = ', '.join(f'{v:.3f}' for v in stats[m]['mean'][order])
        std = ', '.join(f'{v:.3f}' for v in stats[m]['std'][order])
        end = ',' if m == 'visible' else '))'
        lines.append(f'        {m}=dict(mean=[{mean}], std=[{std}], '
                     f'bgr_to_rgb={swap}){end}')
    return '\n'.join(lines)


def build_split_dataset(cfg, split: str):
    """The split's dataset, built as the runner builds it."""
    from mmengine.registry import init_default_scope
    from mmdet.registry import DATASETS
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    ds_cfg = dataset_config(cfg, split)
    dataset = DATASETS.build(copy.deepcopy(ds_cfg))
    if hasattr(dataset, 'full_init'):
        dataset.full_init()
    return dataset, ds_cfg


def run_stats(cfg, split: str = 'train', samples: Optional[int] = None,
              workers: int = 2, progress: bool = True,
              json_out: Optional[str] = None) -> dict:
    """Compute, print and optionally save the statistics of a split."""
    dataset, ds_cfg = build_split_dataset(cfg, split)
    indices = sample_indices(len(dataset), samples)
    pairs = pair_paths(dataset, indices)
    settings = loading_settings(ds_cfg)
    stats = compute_stats(pairs, settings, workers=workers,
                          progress=progress)
    stats.update(split=split, dataset_size=len(dataset),
                 reduced_decode=settings['reduced_decode'])
    stats['config_lines'] = preprocessor_lines(stats, cfg)
    print(format_stats(stats), flush=True)
    if json_out:
        os.makedirs(osp.dirname(osp.abspath(json_out)), exist_ok=True)
        with open(json_out, 'w', encoding='utf-8') as f:
            json.dump(stats, f, indent=1)
        print(f'statistics written to {json_out}')
    return stats


def format_stats(stats: dict) -> str:
    """The statistics and the config lines, as printed."""
    reduced = stats.get('reduced_decode')
    how = '' if not reduced else (
        '; JPEGs decoded reduced, as the loader\'s reduced_decode '
        f'(scale {tuple(reduced["scale"])}) decodes them')
    head = (f'Per-channel statistics of the {stats.get("split", "")} images '
            f'as loaded (before normalisation{how}): {stats["pairs"]} of '
            f'{stats.get("dataset_size", stats["pairs"])} pairs, '
            f'{stats["seconds"]:.1f} s.')
    lines = [head]
    for m in MODALITIES:
        s = stats[m]
        order = 'BGR' if s['channels'] == 3 else 'grey'
        mean = ', '.join(f'{v:.3f}' for v in s['mean'])
        std = ', '.join(f'{v:.3f}' for v in s['std'])
        bits = '/'.join(str(b) for b in s.get('bits', [8]))
        low, high = s.get('range', (None, None))
        lines.append(f'  {m:<8} ({order} as loaded, {s["pixels"]} px, '
                     f'{bits}-bit files, values {low:g}-{high:g}): '
                     f'mean [{mean}]  std [{std}]')
        if s.get('refused'):
            lines.append(
                f'  {m}: {s["refused"]} files have more than 8 bits per '
                'channel and the loader refuses them (the statistics above '
                'are of their raw counts); keep their depth with '
                "LoadPairedImageFromFile(high_depth=dict(rule='fixed', "
                f"low={low:g}, high={high:g})) (this range to 0-255), or "
                "rule='percentile' / 'minmax' per image, then run --stats "
                'again')
    lines.append('PairedDetDataPreprocessor lines for the config:')
    lines.append(stats['config_lines'])
    return '\n'.join(lines)
