"""What :class:`~mmsafe.engine.hooks.FirstBatchStatsHook` computes from the
first training batches. It reads the images of a batch per modality, before
and after the data preprocessor (found by the run's modalities,
:mod:`mmsafe.engine.modalities`: one ``[C, H, W]`` image per sample and
modality):

* :func:`analyse_batch`: per-modality statistics and the flags of broken
  inputs: ``all_zero`` (a modality all zeros after preprocessing),
  ``constant`` (a modality constant in an image: a black raw image becomes
  ``-mean/std`` after normalisation), ``nearly_constant`` (its raw values,
  as the pipeline delivers them, have a standard deviation below
  ``near_constant_std``: a 16-bit thermal frame decoded to 8 bits keeps its
  high byte, 3 grey levels), ``identical`` / ``near_identical`` (visible and
  infrared the same image, or equal up to brightness and contrast),
  ``swapped`` (a grey visible image beside a colour infrared one: the two
  exchanged), and the channel flags of :func:`channel_check`;
* :func:`channel_check`: the channel order and normalisation the
  preprocessor applied. The raw pipeline output is compared with the
  preprocessor output of the same image: an affine fit per output channel
  (:func:`fit_channel_map`) finds the raw channel that explains it, and the
  mean and std applied. The final order is only judged when the fitted
  mean is recognisably ImageNet's mean in RGB or BGR order; it cannot be
  told from image content;
* :class:`PairAlignment`: the image-content alignment of the first visible
  + infrared pairs. Each pair, as the pipeline delivers it, is measured
  with :func:`mmsafe.analysis.pair_alignment.measure_alignment`; a pair
  whose infrared image matches its partner mirrored or shifted is flagged
  at once, and once enough pairs are measured the partners that match none
  of them (``pair_unrelated``) are named. The per-box visible/infrared
  offsets of the same pairs (:mod:`mmsafe.analysis.object_offsets`, the
  boxes of the data samples' ``gt_instances``) flag a pair whose people are
  offset beyond ``max_offset`` pixels (``pair_objects_offset``); their
  distribution is logged when the measurement ends. A pair of which one
  modality is nearly constant
  (:func:`mmsafe.analysis.flat_images.near_constant`: nothing to align,
  e.g. a 16-bit frame cut to its high byte) is not judged: the pairing
  checks abstain on it, count it and say so when the measurement ends;
  ``FirstBatchStatsHook`` flags the modality itself. So is a pair whose two
  images are one image (a missing partner filled with the visible image;
  flagged ``identical``);
* :func:`visualize_pairs`: preprocessed images back to uint8 RGB, as the
  model sees them, for the visualizer's backends.
"""
import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch

from mmsafe.analysis.flat_images import NEAR_CONSTANT_STD, near_constant
from mmsafe.analysis.object_offsets import (FINDING, audit_offsets,
                                            format_summary, offsets_message,
                                            offsets_summary)
from mmsafe.analysis.pair_alignment import (alignment_flag,
                                            measure_alignment,
                                            unrelated_message,
                                            unrelated_pairs)
from mmsafe.analysis.pair_vis import draw_pair
from mmsafe.events import log


def valid_crop(img: Any, shape: Optional[Sequence[int]]) -> Any:
    """A preprocessed ``[C, H, W]`` image cropped to its valid ``(h, w)``
    (the padding removed)."""
    h, w = img.shape[-2:]
    if shape is not None:
        h, w = min(h, int(shape[0])), min(w, int(shape[1]))
    return img[:, :h, :w]


def raw_image(raw_mods: dict, name: str, i: int) -> Optional[Any]:
    """Sample ``i`` of modality ``name`` as the pipeline delivered it."""
    raw = raw_mods.get(name)
    if raw is None:
        return None
    return raw[i] if i < len(raw) else None


def make_flag(kind: str, modality: str, i: int, files: list,
              message: str, ir_files: Optional[list] = None) -> dict:
    """A flag record: ``kind``, ``modality``, ``sample``, ``file`` (and
    ``ir_file`` when known) and the ``message`` naming the sample's
    files."""
    name = files[i] if i < len(files) else None
    ir_name = ir_files[i] if ir_files and i < len(ir_files) else None
    shown = name if ir_name is None else f'{name} | {ir_name}'
    flag = dict(kind=kind, modality=modality, sample=i, file=name,
                message=f'{message} (sample {i}: {shown})')
    if ir_name is not None:
        flag['ir_file'] = ir_name
    return flag


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


def same_image(visible: Any, infrared: Any) -> bool:
    """Whether the two images of a pair are one image (equal values)."""
    return tuple(visible.shape) == tuple(infrared.shape) and \
        bool(torch.equal(visible, infrared))


def _pair_flag(kind: str, result: dict, message: str) -> dict:
    return dict(
        kind=kind, modality='visible+infrared', sample=None,
        file=result.get('file'), ir_file=result.get('ir_file'),
        message=f"{message} (iter {result.get('iter')}: visible="
        f"{result.get('file')} | infrared={result.get('ir_file')}). "
        'Look at the pair with tools/check_dataset.py CONFIG --show-dir '
        'DIR; fix the infrared files or the partner rule, and make '
        'every geometric transform move both images with one draw')


class PairAlignment:
    """Measures pairs until ``max_pairs`` are seen; then it is ``done``.

    Args:
        max_pairs (int): pairs to measure; 0 measures none.
        max_offset (float): median per-box offset (pixels of the original
            images) above which a pair is flagged ``pair_objects_offset``.
        near_constant_std (float): raw standard deviation below which a
            modality is nearly constant (its pair is not judged).
    """

    def __init__(self, max_pairs: int, max_offset: float = 8.0,
                 near_constant_std: float = NEAR_CONSTANT_STD) -> None:
        self.max_pairs = int(max_pairs)
        self.max_offset = float(max_offset)
        self.near_constant_std = float(near_constant_std)
        #: pairs not judged: a modality nearly constant
        self.abstained: List[dict] = []
        self.results: List[dict] = []
        self.offsets: List[dict] = []
        self.offset_summary: Optional[dict] = None
        self.done = self.max_pairs <= 0

    def add_pairs(self, visible: Sequence[Any], infrared: Sequence[Any],
                  samples: Sequence[Any], files: Sequence[Optional[str]],
                  ir_files: Sequence[Optional[str]], it: int,
                  raw: bool = True) -> List[dict]:
        """Measure the pairs of one batch of iteration ``it``; return the
        flags they raise (the unrelated partners too when this batch
        completes the measurement).

        Args:
            visible (list): the visible image of each pair (``[C, H, W]``).
            infrared (list): its infrared partner.
            samples (list): their data samples (boxes, geometry meta).
            files (list): the visible file of each pair.
            ir_files (list): the infrared file of each pair.
            it (int): the iteration (1-based).
            raw (bool): the images are as the pipeline delivered them
                (0-255 values): a nearly constant one is not judged. False
                for preprocessed images, whose values are normalised.
        """
        if self.done:
            return []
        flags = []
        for i, (vis, ir) in enumerate(zip(visible, infrared)):
            if self._seen() >= self.max_pairs:
                break
            if tuple(vis.shape[-2:]) != tuple(ir.shape[-2:]):
                continue  # a size check of the loader refuses these
            file = files[i] if i < len(files) else None
            ir_file = ir_files[i] if i < len(ir_files) else None
            flat = [name for name, img in (('visible', vis), ('infrared', ir))
                    if raw and near_constant(img, self.near_constant_std)
                    is not None]
            if flat:
                self.abstained.append(dict(
                    file=file, modalities=flat, ir_file=ir_file, iter=it))
                continue
            if same_image(vis, ir):
                # nothing to align: one image twice (flagged identical)
                self.abstained.append(dict(
                    file=file, modalities=[], ir_file=ir_file, iter=it))
                continue
            result = measure_alignment(vis, ir)
            result.update(file=file, ir_file=ir_file, iter=it)
            self.results.append(result)
            if alignment_flag(result):
                flags.append(_pair_flag(f'pair_{result["verdict"]}', result,
                                        result['message']))
            flags += self._offsets(vis, ir, samples[i] if i < len(samples)
                                   else None, result)
        if self._seen() >= self.max_pairs:
            flags += self.finish()
        return flags

    def _seen(self) -> int:
        return len(self.results) + len(self.abstained)

    def _offsets(self, vis, ir, sample, result: dict) -> List[dict]:
        """Per-box offsets of one pair; its ``pair_objects_offset`` flag."""
        if sample is None:
            return []
        offsets, found = audit_offsets(dict(visible=vis, infrared=ir),
                                       sample, self.max_offset)
        if offsets is None:
            return []
        offsets.update(file=result['file'], ir_file=result['ir_file'],
                       iter=result['iter'])
        self.offsets.append(offsets)
        if not found:
            return []
        return [_pair_flag(FINDING, offsets, offsets_message(offsets))]

    def finish(self) -> List[dict]:
        """End the measurement; return the ``pair_unrelated`` flags of the
        pairs measured (empty when it had ended already)."""
        if self.done:
            return []
        self.done = True
        if self.abstained:
            first = self.abstained[0]
            flat = sorted({m for a in self.abstained
                           for m in a['modalities']})
            same = sum(1 for a in self.abstained if not a['modalities'])
            why = ([f'their {"/".join(flat)} image is nearly constant '
                    '(flagged nearly_constant)'] if flat else []) + (
                [f'{same} are one image twice (flagged identical)']
                if same else [])
            log(f'FirstBatchStatsHook: the pairing checks abstained on '
                f'{len(self.abstained)} of {self._seen()} pairs: '
                f'{"; ".join(why)}, with nothing to align; first: visible='
                f"{first['file']} | infrared={first['ir_file']}")
        if self.offsets:
            self.offset_summary = offsets_summary(
                [dict(img_path=o['file'], offsets=o) for o in self.offsets])
            log('FirstBatchStatsHook: ' + format_summary(
                self.offset_summary, max_folders=3) +
                f' (first {len(self.results)} pairs; flag above '
                f'{self.max_offset:g} px)')
        return [
            _pair_flag('pair_unrelated', self.results[i],
                       unrelated_message(self.results[i], self.results))
            for i in unrelated_pairs(self.results)
        ]


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
    :func:`analyse_batch`), with their boxes, to the visualizer as
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
