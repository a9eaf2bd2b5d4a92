"""Statistics of a preprocessed batch and the flags of broken inputs.

Flags: ``all_zero`` (a modality all zeros after preprocessing),
``constant`` (a modality constant in an image: a black raw image becomes
``-mean/std`` after normalisation), ``nearly_constant`` (its raw values,
as the pipeline delivers them, have a standard deviation below
``near_constant_std``: a 16-bit thermal frame decoded to 8 bits keeps its
high byte, 3 grey levels), ``identical`` / ``near_identical`` (visible and
infrared the same image, or equal up to brightness and contrast),
``swapped`` (a grey visible image beside a colour infrared one: the two
exchanged), and the channel flags of :mod:`.channels`.
"""
from typing import Any, Dict, List, Optional

import torch

from mmsafe.analysis.flat_images import NEAR_CONSTANT_STD, near_constant
from .batch import make_flag, raw_image, valid_crop
from .channels import channel_check


def _identical_flag(raw_mods: dict, out_mods: dict, i: int, shapes: list,
                    files: list, identical_corr: float,
                    ir_files: Optional[list] = None):
    """The ``identical`` / ``near_identical`` flag of pair ``i``, or None."""
    rv, ri = raw_image(raw_mods, 'visible', i), raw_image(
        raw_mods, 'infrared', i)
    ov = valid_crop(out_mods['visible'][i], shapes[i])
    oi = valid_crop(out_mods['infrared'][i], shapes[i])
    if rv is not None and ri is not None and rv.shape == ri.shape and \
            torch.equal(rv, ri):
        return make_flag(
            'identical', 'visible+infrared', i, files,
            'visible and infrared are the same image (the pipeline '
            'delivered identical pixels: check the infrared file and the '
            'partner lookup)', ir_files)
    if ov.shape == oi.shape and torch.equal(ov, oi):
        return make_flag(
            'identical', 'visible+infrared', i, files,
            'visible and infrared are identical after preprocessing',
            ir_files)
    if ov.shape[-2:] != oi.shape[-2:]:
        return None
    a = ov.float().mean(0).flatten().double()
    b = oi.float().mean(0).flatten().double()
    a, b = a - a.mean(), b - b.mean()
    denom = float(a.norm() * b.norm())
    if denom > 0:
        corr = float((a * b).sum()) / denom
        if corr >= identical_corr:
            return make_flag(
                'near_identical', 'visible+infrared', i, files,
                f'visible and infrared are the same image up to '
                f'brightness/contrast (correlation {corr:.5f})', ir_files)
    return None


def _grey(img: Any) -> Optional[bool]:
    """Whether a 3-channel raw image has three equal channels (None: not
    a 3-channel tensor)."""
    if not isinstance(img, torch.Tensor) or img.dim() != 3 or \
            img.shape[0] != 3:
        return None
    return bool(torch.equal(img[0], img[1]) and torch.equal(img[1], img[2]))


def _swapped_flag(raw_mods: dict, i: int, files: list,
                  ir_files: Optional[list]) -> Optional[dict]:
    """The ``swapped`` flag of pair ``i``: its visible image is grey (three
    equal channels) and its infrared image is in colour, as when the two
    are exchanged (a list in the other order, keys mixed up)."""
    vis_grey = _grey(raw_image(raw_mods, 'visible', i))
    ir_grey = _grey(raw_image(raw_mods, 'infrared', i))
    if vis_grey is True and ir_grey is False:
        return make_flag(
            'swapped', 'visible+infrared', i, files,
            'the visible image is grey (three equal channels) and the '
            'infrared image is in colour: the two modalities look '
            'exchanged (the order of a list of two, the keys of a dict, '
            'or the channels of a stacked tensor)', ir_files)
    return None


def _near_constant_flag(name: str, raw: torch.Tensor, spread: float, i: int,
                        files: list) -> dict:
    low, high = float(raw.min()), float(raw.max())
    hint = ''
    if raw.dtype == torch.uint8 and high - low <= 8:
        hint = (' (a 16-bit thermal image decoded to 8 bits keeps its high '
                'byte only: LoadPairedImageFromFile reads the real depth and '
                'keeps it with high_depth=dict(rule=...))')
    return make_flag(
        'nearly_constant', name, i, files,
        f'{name} is nearly constant: its raw values {low:g}-{high:g} have '
        f'a standard deviation of {spread:.3g}{hint}; the pairing checks '
        'abstain on this pair')


def _constant_flags(name: str, crops: list, raw_mods: dict, files: list,
                    constant_eps: float,
                    near_constant_std: float) -> List[dict]:
    flags = []
    for i, crop in enumerate(crops):
        # per channel: a black image is (0 - mean_c) / std_c
        per_channel = crop.reshape(crop.shape[0], -1)
        span = float((per_channel.amax(1) - per_channel.amin(1)).max())
        if float(crop.abs().max()) == 0:
            flags.append(make_flag('all_zero', name, i, files,
                                   f'{name} is all zeros after '
                                   'preprocessing'))
        elif span <= constant_eps:
            raw = raw_image(raw_mods, name, i)
            black = raw is not None and int(raw.max()) == 0
            flags.append(make_flag(
                'constant', name, i, files,
                f'{name} is constant ({float(crop.flatten()[0]):.4g})' +
                (' - the loaded image is black (all zeros)'
                 if black else '')))
        else:
            raw = raw_image(raw_mods, name, i)
            spread = near_constant(raw, near_constant_std)
            if spread is not None:
                flags.append(_near_constant_flag(name, raw, spread, i,
                                                 files))
    return flags


def analyse_batch(raw_mods: Dict[str, list], out_mods: Dict[str, list],
                  samples: list, pre: Any, constant_eps: float,
                  identical_corr: float, loaded_order: str,
                  near_constant_std: float = NEAR_CONSTANT_STD,
                  files: Optional[list] = None,
                  ir_files: Optional[list] = None) -> dict:
    """Statistics and flags of one batch, before and after ``pre``.

    Args:
        raw_mods (dict): per modality (``visible``/``infrared``, or
            ``img``), the images the preprocessor received, one
            ``[C, H, W]`` tensor per sample (as the pipeline delivered
            them); a modality may be missing.
        out_mods (dict): the same for what it returned (what the model
            receives, padded).
        samples (list): the data samples it returned.
        pre: the data preprocessor (for its declared settings).
        constant_eps (float): max - min below which an image is constant.
        identical_corr (float): grey-image correlation from which visible
            and infrared count as near-identical.
        loaded_order (str): channel order the loader produces.
        near_constant_std (float): raw standard deviation below which a
            modality is nearly constant.
        files (list, optional): the visible (or only) file per sample.
        ir_files (list, optional): the infrared file per sample.

    Returns:
        dict: ``modalities`` (per modality: range, mean, std, channel
        means, channel order), ``flags``, ``batch_size``, ``img_shapes``,
        ``batch_input_shape``, ``boxes_per_image``, ``files``; and ``out``
        and ``samples`` (the preprocessed images and data samples, for the
        visualizer; not for the event log).
    """
    out_mods = {k: [img.detach() for img in v] for k, v in out_mods.items()}
    batch = len(next(iter(out_mods.values())))
    shapes = [s.metainfo.get('img_shape') for s in samples] or [None] * batch
    files = list(files or []) or [None] * batch
    flags: List[dict] = []
    mods: Dict[str, dict] = {}
    for name, out in out_mods.items():
        crops = [valid_crop(out[i], shapes[i]) for i in range(batch)]
        flat = torch.cat([c.reshape(c.shape[0], -1) for c in crops],
                         1).float()
        mods[name] = dict(
            shape=[batch] + list(out[0].shape),
            min=float(flat.min()),
            max=float(flat.max()),
            mean=float(flat.mean()),
            std=float(flat.std()),
            channel_mean=[round(float(v), 4) for v in flat.mean(1)])
        flags += _constant_flags(name, crops, raw_mods, files, constant_eps,
                                 near_constant_std)
        info, channel_flags = channel_check(name, raw_mods, out, shapes,
                                            files, pre, loaded_order)
        mods[name].update(info)
        flags += channel_flags
    if 'visible' in out_mods and 'infrared' in out_mods:
        for i in range(batch):
            flag = _identical_flag(raw_mods, out_mods, i, shapes, files,
                                   identical_corr, ir_files) or \
                _swapped_flag(raw_mods, i, files, ir_files)
            if flag is not None:
                flags.append(flag)
    first = next(iter(out_mods.values()))[0]
    return dict(
        modalities=mods,
        flags=flags,
        batch_size=batch,
        img_shapes=[list(s) if s is not None else None for s in shapes],
        batch_input_shape=list(first.shape[-2:]),
        boxes_per_image=[len(getattr(s, 'gt_instances', []))
                         for s in samples],
        files=files,
        ir_files=list(ir_files or []),
        out=out_mods,
        samples=samples)
