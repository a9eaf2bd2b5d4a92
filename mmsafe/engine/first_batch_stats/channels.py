"""Recover the channel order and normalisation a data preprocessor applied.

The check compares the raw pipeline output with the preprocessor output of
the same image: an affine fit per output channel finds the raw channel that
explains it, and the mean and std applied. The final order is only judged
when the fitted mean is recognisably ImageNet's mean in RGB or BGR order;
it cannot be told from image content.
"""
import math
from typing import Any, List, Optional, Sequence

import torch

from .batch import make_flag, raw_image, valid_crop

IMAGENET_MEAN_RGB = (123.675, 116.28, 103.53)
#: pixels used per channel to fit the preprocessor's affine map
_FIT_PIXELS = 65536


def fit_channel_map(raw: torch.Tensor, out: torch.Tensor) -> Optional[dict]:
    """Recover how the preprocessor mapped a raw image to its output.

    For each output channel the raw channel that explains it best with an
    affine map ``out = (raw - mean) / std`` is found by least squares.

    Args:
        raw (Tensor): ``[C, h, w]`` pipeline output (uint8).
        out (Tensor): ``[C, h, w]`` preprocessed image, same size.

    Returns:
        dict | None: ``mapping`` (raw channel per output channel, None when
        the raw channels are identical, e.g. a grey infrared image),
        ``mean``, ``std`` (per output channel) and ``residual``; None when
        the sizes differ (a batch resize) or the image is constant.
    """
    if raw.shape != out.shape or raw.dim() != 3:
        return None
    c = raw.shape[0]
    step = max(1, math.ceil(raw[0].numel() / _FIT_PIXELS))
    x = raw.reshape(c, -1)[:, ::step].double().cpu()
    y = out.reshape(c, -1)[:, ::step].double().cpu()
    grey = all(torch.equal(x[0], x[k]) for k in range(1, c))
    mapping, means, stds, residuals = [], [], [], []
    for j in range(c):
        best = None
        for i in range(c):
            xi = x[i] - x[i].mean()
            var = float((xi * xi).sum())
            if var == 0:
                return None
            a = float((xi * (y[j] - y[j].mean())).sum()) / var
            b = float(y[j].mean()) - a * float(x[i].mean())
            res = float((y[j] - (a * x[i] + b)).abs().max())
            if best is None or res < best[0]:
                best = (res, i, a, b)
        res, i, a, b = best
        mapping.append(i)
        residuals.append(res)
        means.append(-b / a if a else float('nan'))
        stds.append(1.0 / a if a else float('nan'))
    return dict(mapping=None if grey else mapping, mean=means, std=stds,
                residual=max(residuals))


def declared_swap(pre: Any, name: str) -> Optional[bool]:
    """What the preprocessor says it does with the channel order."""
    per_modality = getattr(pre, 'modality_bgr_to_rgb', None)  # mmsafe's
    if isinstance(per_modality, dict) and name in per_modality:
        return bool(per_modality[name])
    if hasattr(pre, '_channel_conversion'):  # mmdet/mmengine preprocessors
        return bool(pre._channel_conversion)
    return None


def order_of_mean(mean: Sequence[float], tol: float = 1.0) -> Optional[str]:
    """'rgb' / 'bgr' when ``mean`` is ImageNet's mean in that order."""
    if mean is None or len(mean) != 3:
        return None
    if all(abs(m - r) <= tol for m, r in zip(mean, IMAGENET_MEAN_RGB)):
        return 'rgb'
    if all(abs(m - r) <= tol for m, r in zip(mean, IMAGENET_MEAN_RGB[::-1])):
        return 'bgr'
    return None


def _first_fit(name: str, raw_mods: dict, out: list,
               shapes: list) -> Optional[dict]:
    for i in range(len(out)):
        raw = raw_image(raw_mods, name, i)
        if raw is None or not isinstance(raw, torch.Tensor):
            return None
        fit = fit_channel_map(raw, valid_crop(out[i], shapes[i]))
        if fit is not None:
            return fit
    return None


def channel_check(name: str, raw_mods: dict, out: list,
                  shapes: list, files: list, pre: Any,
                  loaded: str) -> tuple:
    """Channel mapping, mean/std and the resulting order of one modality.

    Args:
        name (str): the modality (``'visible'``, ``'infrared'``, ``'img'``).
        raw_mods (dict): raw pipeline output per modality.
        out (list): the preprocessed images of this modality, one
            ``[C, H, W]`` tensor per sample.
        shapes (list): valid ``(h, w)`` per sample (None: whole image).
        files (list): file name per sample, for the flags.
        pre: the model's data preprocessor.
        loaded (str): the order the loader produces (``'bgr'``/``'rgb'``).

    Returns:
        tuple: ``(info, flags)``: the fields for the statistics record and
        the ``channel_conversion`` / ``channel_order`` flags.
    """
    flags: List[dict] = []
    fit = _first_fit(name, raw_mods, out, shapes)
    declared = declared_swap(pre, name)
    info = dict(declared_bgr_to_rgb=declared)
    if fit is None:
        info['channel_order'] = 'not determined (sizes differ after a '\
            'batch resize, constant images, or no raw input)'
        return info, flags
    info.update(fitted_mean=[round(v, 3) for v in fit['mean']],
                fitted_std=[round(v, 3) for v in fit['std']])
    if fit['mapping'] is None:
        info['channel_order'] = 'grey image (channel order irrelevant)'
        return info, flags
    swapped = {(0, 1, 2): False, (2, 1, 0): True}.get(tuple(fit['mapping']))
    if swapped is None:
        info['channel_order'] = f'channels remapped {fit["mapping"]}'
        flags.append(make_flag(
            'channel_conversion', name, 0, files,
            f'{name}: the preprocessor maps raw channels {fit["mapping"]}'
            ' to the model input; expected a plain copy or a BGR<->RGB '
            'swap'))
        return info, flags
    final = loaded if not swapped else {'bgr': 'rgb', 'rgb': 'bgr'}[loaded]
    info['swapped'] = swapped
    info['channel_order'] = final
    if declared is not None and declared != swapped:
        flags.append(make_flag(
            'channel_conversion', name, 0, files,
            f'{name}: the preprocessor is configured with bgr_to_rgb='
            f'{declared} but {"swaps" if swapped else "keeps"} the '
            'channel order'))
    expected = order_of_mean(fit['mean'])
    info['mean_order'] = expected
    if expected is not None and expected != final:
        flags.append(make_flag(
            'channel_order', name, 0, files,
            f'{name}: the model receives {final.upper()} images (loaded '
            f'{loaded.upper()}, bgr_to_rgb={swapped}) but the '
            f'normalisation mean {info["fitted_mean"]} is ImageNet\'s in '
            f'{expected.upper()} order; set bgr_to_rgb={not swapped} for '
            f'this modality in the data_preprocessor (heuristic: it '
            'assumes the loader gives '
            f'{loaded.upper()})'))
    return info, flags
