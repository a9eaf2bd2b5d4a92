"""Preprocessed images back to uint8 RGB, as the model sees them, for the
visualizer's backends."""
from typing import Any

import numpy as np
import torch

from mmsafe.analysis.pair_vis import draw_pair
from .batch import valid_crop


def declared_norm(pre: Any, name: str):
    """``(mean, std)`` tensors ``[C, 1, 1]`` of the preprocessor, if any."""
    for mean_key, std_key in ((f'{name}_mean', f'{name}_std'),
                              ('mean', 'std')):
        mean, std = getattr(pre, mean_key, None), getattr(pre, std_key, None)
        if isinstance(mean, torch.Tensor) and isinstance(std, torch.Tensor):
            return mean.detach().cpu().float(), std.detach().cpu().float()
    return None


def to_display(pre: Any, name: str, img: torch.Tensor,
               info: dict) -> np.ndarray:
    """A preprocessed ``[C, h, w]`` image back to ``[h, w, C]`` uint8 RGB:
    un-normalised with the preprocessor's declared mean/std, else with the
    fitted ones (``info``), else stretched to 0-255."""
    norm = declared_norm(pre, name)
    img = img.detach().cpu().float()
    if norm is not None:
        mean, std = norm
        img = img * std + mean
    elif 'fitted_mean' in info:
        img = img * torch.tensor(info['fitted_std']).view(-1, 1, 1) + \
            torch.tensor(info['fitted_mean']).view(-1, 1, 1)
    else:
        lo, hi = img.min(), img.max()
        img = (img - lo) / (hi - lo + 1e-12) * 255
    arr = img.clamp(0, 255).byte().permute(1, 2, 0).numpy()
    if arr.shape[2] == 3 and info.get('channel_order') == 'bgr':
        arr = arr[..., ::-1]
    return np.ascontiguousarray(arr)


def visualize_pairs(visualizer: Any, pre: Any, captured: dict,
                    max_vis: int, step: int) -> None:
    """Send the first ``max_vis`` pairs of an analysed batch (see
    :func:`~.stats.analyse_batch`), with their boxes, to the visualizer as
    ``first_batch_pair_{i}`` images."""
    meta = getattr(visualizer, 'dataset_meta', None) or {}
    classes = tuple(meta.get('classes', ()) or ())
    out, mods = captured['out'], captured['modalities']
    names = list(out)
    for i in range(min(max_vis, captured['batch_size'])):
        shape = captured['img_shapes'][i]
        imgs = [to_display(pre, n, valid_crop(out[n][i], shape), mods[n])
                for n in names[:2]]
        sample = captured['samples'][i] if captured['samples'] else None
        gt = getattr(sample, 'gt_instances', None)
        canvas = draw_pair(imgs[0], imgs[1] if len(imgs) > 1 else None,
                           getattr(gt, 'bboxes', None),
                           getattr(gt, 'labels', None), classes)
        visualizer.add_image(f'first_batch_pair_{i}', canvas, step=step)
