"""Log what the model really receives in the first batches of a run.

Unit and normalisation bugs (a modality that is all zeros, the visible image
loaded twice, BGR fed to an RGB-pretrained backbone) do not crash anything;
they only make a run learn less, which is noticed days later. The statistics
of the first batches, as they come out of the data preprocessor, show them
in the first minute (see CONTEXT.md, incident 2).
"""
import logging
import math
from typing import Any, Dict, List, Optional, Sequence

import numpy as np
import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from mmdet.registry import HOOKS
from mmsafe.events import log, update_counters, write_event

IMAGENET_MEAN_RGB = (123.675, 116.28, 103.53)
#: pixels used per channel to fit the preprocessor's affine map
_FIT_PIXELS = 65536


def _as_modalities(inputs: Any) -> Dict[str, Any]:
    """``{'visible': x, 'infrared': y}`` for paired inputs, ``{'img': x}``
    for a single-modality detector."""
    if isinstance(inputs, dict):
        return dict(inputs)
    return {'img': inputs}


def _valid_crop(batch: torch.Tensor, i: int, shape) -> torch.Tensor:
    h, w = batch.shape[-2:]
    if shape is not None:
        h, w = min(h, int(shape[0])), min(w, int(shape[1]))
    return batch[i, :, :h, :w]


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


def _declared_swap(pre: Any, name: str) -> Optional[bool]:
    """What the preprocessor says it does with the channel order."""
    per_modality = getattr(pre, '_bgr_to_rgb', None)
    if isinstance(per_modality, dict) and name in per_modality:
        return bool(per_modality[name])
    if hasattr(pre, '_channel_conversion'):  # mmdet/mmengine preprocessors
        return bool(pre._channel_conversion)
    return None


def _declared_norm(pre: Any, name: str):
    """``(mean, std)`` tensors ``[C, 1, 1]`` of the preprocessor, if any."""
    for mean_key, std_key in ((f'{name}_mean', f'{name}_std'),
                              ('mean', 'std')):
        mean, std = getattr(pre, mean_key, None), getattr(pre, std_key, None)
        if isinstance(mean, torch.Tensor) and isinstance(std, torch.Tensor):
            return mean.detach().cpu().float(), std.detach().cpu().float()
    return None


def _order_of_mean(mean: Sequence[float], tol: float = 1.0) -> Optional[str]:
    """'rgb' / 'bgr' when ``mean`` is ImageNet's mean in that order."""
    if mean is None or len(mean) != 3:
        return None
    if all(abs(m - r) <= tol for m, r in zip(mean, IMAGENET_MEAN_RGB)):
        return 'rgb'
    if all(abs(m - r) <= tol for m, r in zip(mean, IMAGENET_MEAN_RGB[::-1])):
        return 'bgr'
    return None


@HOOKS.register_module()
class FirstBatchStatsHook(Hook):
    """Log per-modality statistics of the first training batches after the
    data preprocessor, flag broken inputs, and show the first pairs.

    For each of the first ``num_batches`` iterations it logs, per modality
    (``visible`` / ``infrared``; ``img`` for a single-modality model), the
    value range, mean and std over the valid (unpadded) pixels, the
    per-channel means, the image sizes and the boxes per image. It flags:

    * ``all_zero``: a modality that is all zeros after preprocessing;
    * ``constant``: a modality that is constant in an image (a black raw
      image becomes ``-mean/std`` after normalisation, so it is caught here);
    * ``identical``: visible and infrared are the same image (the raw
      pipeline outputs are equal, or the preprocessed tensors are), or
      ``near_identical``: equal up to brightness/contrast (correlation of
      the grey images >= ``identical_corr``);
    * ``channel_conversion``: the preprocessor swaps (or keeps) the channel
      order against its own ``bgr_to_rgb`` setting;
    * ``channel_order``: the model receives one order while the
      preprocessor's mean is ImageNet's mean in the other order.

    The channel-order check is a heuristic and says so: it compares the raw
    pipeline output with the preprocessor output of the same image (an
    affine fit per channel recovers the channel mapping, mean and std that
    were applied), assumes the loader produced ``loaded_channel_order``
    (``'bgr'`` for MMCV's loaders), and only judges the final order when the
    mean is recognisably ImageNet's (123.675, 116.28, 103.53) in RGB or BGR
    order. It cannot tell an order from image content, is skipped for grey
    images (infrared with three equal channels) and for batches that a batch
    augmentation resized.

    Pair alignment (``alignment=True``): the first ``alignment_pairs``
    pairs, as the pipeline delivers them, are measured with
    :func:`mmsafe.tools_lib.pair_alignment.measure_alignment` (correlation
    of the two images' gradient maps, as they are, shifted and mirrored).
    A pair whose infrared image matches its partner mirrored
    (``pair_mirrored``) or shifted (``pair_shifted``) is a warning naming
    both files; when hardly any of those pairs matches at all, the
    partners are from other frames and the pairs are named
    (``pair_unrelated``). This measures content, so it also sees what no
    geometry record can: an infrared folder mirrored on disk, partners
    permuted. It costs a few milliseconds per pair.

    The statistics are taken from the output of the model's
    ``data_preprocessor`` with a forward hook, i.e. exactly what the model's
    ``loss`` receives, and the first batch's pairs (up to ``max_vis``), with
    their boxes, are sent to the visualizer's backends
    (``runner.visualizer.add_image``: TensorBoard images, or PNG files with
    ``LocalVisBackend``) as the model sees them, converted back to RGB.

    Args:
        num_batches (int): how many first batches to inspect. Defaults to 1.
        max_vis (int): pairs of the first batch sent to the visualizer;
            0 disables. Defaults to 4.
        on_fault (str): ``'warn'`` logs the flags; ``'raise'`` raises a
            ``RuntimeError`` after logging them. Defaults to ``'warn'``.
        constant_eps (float): max - min below which an image is constant.
        identical_corr (float): grey-image correlation from which visible
            and infrared count as near-identical. Defaults to 0.9999.
        loaded_channel_order (str): channel order of the loaded images
            (``'bgr'`` for MMCV's ``LoadImageFromFile`` and mmsafe's paired
            loader). Defaults to ``'bgr'``.
        alignment (bool): measure the image-content alignment of the first
            pairs. Defaults to True.
        alignment_pairs (int): how many first pairs to measure (batches
            beyond ``num_batches`` are read until there are this many).
            Unrelated partners are judged over them once at least 8 are
            measured. Defaults to 16.
    """

    priority = 'NORMAL'

    def __init__(self,
                 num_batches: int = 1,
                 max_vis: int = 4,
                 on_fault: str = 'warn',
                 constant_eps: float = 1e-6,
                 identical_corr: float = 0.9999,
                 loaded_channel_order: str = 'bgr',
                 alignment: bool = True,
                 alignment_pairs: int = 16) -> None:
        if on_fault not in ('warn', 'raise'):
            raise ValueError(f"on_fault must be 'warn' or 'raise', got "
                             f'{on_fault!r}')
        if loaded_channel_order not in ('bgr', 'rgb'):
            raise ValueError("loaded_channel_order must be 'bgr' or 'rgb'")
        self.num_batches = int(num_batches)
        self.max_vis = int(max_vis)
        self.on_fault = on_fault
        self.constant_eps = float(constant_eps)
        self.identical_corr = float(identical_corr)
        self.loaded_channel_order = loaded_channel_order
        self._handle = None
        self._armed = False
        self._captured: Optional[dict] = None
        self._seen = 0
        self._pre = None
        self.flags: List[dict] = []
        self.stats: List[dict] = []
        self.alignment = bool(alignment)
        self.alignment_pairs = int(alignment_pairs)
        self.alignments: List[dict] = []
        self._align_done = not self.alignment or self.alignment_pairs <= 0

    # ----------------------------------------------------------- plumbing
    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        self._pre = getattr(model, 'data_preprocessor', None)
        if self._pre is None or self.num_batches <= 0:
            log('FirstBatchStatsHook: the model has no data_preprocessor; '
                'no first-batch statistics', logging.WARNING)
            return
        self._handle = self._pre.register_forward_hook(
            self._capture, with_kwargs=True)

    def before_train_iter(self, runner, batch_idx: int,
                          data_batch: Any = None) -> None:
        self._armed = self._handle is not None and \
            self._seen < self.num_batches
        self._captured = None

    def _capture(self, module, args, kwargs, output) -> None:
        # only the call that train_step makes between before/after_train_iter
        if not self._armed or self._captured is not None:
            return
        data = args[0] if args else kwargs.get('data')
        with torch.no_grad():
            self._captured = self._analyse(data, output)

    def after_train_iter(self, runner, batch_idx: int,
                         data_batch: Any = None, outputs=None) -> None:
        self._alignment_step(runner, data_batch)
        if not self._armed:
            return
        self._armed = False
        captured = self._captured
        self._captured = None
        if captured is None:
            log('FirstBatchStatsHook: the data_preprocessor was not called '
                f'through its forward in iteration {runner.iter + 1}; '
                'running it once more on the batch (training=False) for the '
                'statistics', logging.WARNING)
            with torch.no_grad():
                captured = self._analyse(
                    data_batch, self._pre(dict(data_batch), False))
        self._seen += 1
        self._report(runner, captured)
        if self._seen == 1 and self.max_vis > 0:
            self._visualize(runner, captured)
        if self._seen >= self.num_batches:
            self._remove()
        if captured['flags'] and self.on_fault == 'raise':
            raise RuntimeError(
                'FirstBatchStatsHook: broken inputs in the first batch: ' +
                '; '.join(f['message'] for f in captured['flags']) +
                " (on_fault='warn' only logs them)")

    def after_train(self, runner) -> None:
        self._remove()
        if not self._align_done:
            self._align_done = True
            self._judge_unrelated(runner)

    # ---------------------------------------------------------- alignment
    def _alignment_step(self, runner, data_batch: Any) -> None:
        """Measure the alignment of this batch's pairs (raw pipeline
        output, before the preprocessor) until enough were seen."""
        if self._align_done:
            return
        inputs = data_batch.get('inputs') if isinstance(data_batch,
                                                        dict) else None
        if not (isinstance(inputs, dict) and 'visible' in inputs
                and 'infrared' in inputs):
            self._align_done = True  # not a paired model
            return
        from mmsafe.tools_lib.pair_alignment import (alignment_flag,
                                                     measure_alignment)
        samples = list(data_batch.get('data_samples') or [])
        it = runner.iter + 1
        new_flags = []
        for i, (vis, ir) in enumerate(zip(inputs['visible'],
                                          inputs['infrared'])):
            if len(self.alignments) >= self.alignment_pairs:
                break
            if tuple(vis.shape[-2:]) != tuple(ir.shape[-2:]):
                continue  # PackPairedDetInputs refuses these already
            meta = samples[i].metainfo if i < len(samples) else {}
            result = measure_alignment(vis, ir)
            result.update(file=meta.get('img_path'),
                          ir_file=meta.get('ir_img_path'), iter=it)
            self.alignments.append(result)
            if alignment_flag(result):
                new_flags.append(self._pair_flag(
                    f'pair_{result["verdict"]}', result, result['message']))
        if len(self.alignments) >= self.alignment_pairs:
            self._align_done = True
            new_flags += self._judge_unrelated(runner, report=False)
        self._report_pair_flags(runner, new_flags)

    @staticmethod
    def _pair_flag(kind: str, result: dict, message: str) -> dict:
        return dict(
            kind=kind, modality='visible+infrared', sample=None,
            file=result.get('file'), ir_file=result.get('ir_file'),
            message=f"{message} (iter {result.get('iter')}: visible="
            f"{result.get('file')} | infrared={result.get('ir_file')}). "
            'Look at the pair with tools/check_dataset.py CONFIG --show-dir '
            'DIR; fix the infrared files or the partner rule, and make '
            'every geometric transform paired')

    def _judge_unrelated(self, runner, report: bool = True) -> List[dict]:
        from mmsafe.tools_lib.pair_alignment import (unrelated_message,
                                                     unrelated_pairs)
        named = unrelated_pairs(self.alignments)
        flags = [
            self._pair_flag(
                'pair_unrelated', self.alignments[i],
                unrelated_message(self.alignments[i], self.alignments))
            for i in named
        ]
        if report:
            self._report_pair_flags(runner, flags)
        return flags

    def _report_pair_flags(self, runner, flags: List[dict]) -> None:
        if not flags:
            return
        for flag in flags:
            log(f'FirstBatchStatsHook: {flag["kind"]}: {flag["message"]}',
                logging.WARNING)
            fields = dict(flag)
            fields['flag'] = fields.pop('kind')
            write_event(runner.work_dir, 'first_batch_flag',
                        iter=runner.iter + 1, **fields)
        self.flags += flags
        update_counters('first_batch_stats', batches=self._seen,
                        flags=len(self.flags),
                        flag_kinds=sorted({f['kind'] for f in self.flags}))
        if self.on_fault == 'raise':
            raise RuntimeError(
                'FirstBatchStatsHook: misaligned pairs: ' +
                '; '.join(f['message'] for f in flags) +
                " (on_fault='warn' only logs them)")

    def _remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    # ----------------------------------------------------------- analysis
    def _analyse(self, data: dict, output: dict) -> dict:
        raw_mods = _as_modalities(data['inputs'])
        out_mods = {
            k: v.detach()
            for k, v in _as_modalities(output['inputs']).items()
        }
        samples = list(output.get('data_samples') or [])
        batch = next(iter(out_mods.values())).shape[0]
        shapes = [s.metainfo.get('img_shape') for s in samples] or \
            [None] * batch
        files = [s.metainfo.get('img_path') for s in samples] or \
            [None] * batch
        flags: List[dict] = []
        mods: Dict[str, dict] = {}
        for name, out in out_mods.items():
            crops = [_valid_crop(out, i, shapes[i]) for i in range(batch)]
            flat = torch.cat([c.reshape(c.shape[0], -1) for c in crops], 1)
            flat = flat.float()
            mods[name] = dict(
                shape=list(out.shape),
                min=float(flat.min()),
                max=float(flat.max()),
                mean=float(flat.mean()),
                std=float(flat.std()),
                channel_mean=[round(float(v), 4) for v in flat.mean(1)])
            for i, crop in enumerate(crops):
                # per channel: a black image is (0 - mean_c) / std_c
                per_channel = crop.reshape(crop.shape[0], -1)
                span = float((per_channel.amax(1) -
                              per_channel.amin(1)).max())
                if float(crop.abs().max()) == 0:
                    flags.append(self._flag(
                        'all_zero', name, i, files,
                        f'{name} is all zeros after preprocessing'))
                elif span <= self.constant_eps:
                    raw = self._raw(raw_mods, name, i)
                    black = raw is not None and int(raw.max()) == 0
                    flags.append(self._flag(
                        'constant', name, i, files,
                        f'{name} is constant ({float(crop.flatten()[0]):.4g})'
                        + (' - the loaded image is black (all zeros)'
                           if black else '')))
            mods[name].update(self._channel_check(name, raw_mods, out,
                                                  shapes, flags, files))
        if 'visible' in out_mods and 'infrared' in out_mods:
            for i in range(batch):
                self._identical_check(raw_mods, out_mods, i, shapes, flags,
                                      files)
        boxes = [len(getattr(s, 'gt_instances', [])) for s in samples]
        return dict(
            modalities=mods,
            flags=flags,
            batch_size=batch,
            img_shapes=[list(s) if s is not None else None for s in shapes],
            batch_input_shape=list(next(iter(out_mods.values())).shape[-2:]),
            boxes_per_image=boxes,
            files=files,
            out=out_mods,
            samples=samples)

    @staticmethod
    def _raw(raw_mods: dict, name: str, i: int) -> Optional[torch.Tensor]:
        raw = raw_mods.get(name)
        if raw is None:
            return None
        return raw[i] if i < len(raw) else None

    @staticmethod
    def _flag(kind: str, modality: str, i: int, files: list,
              message: str) -> dict:
        name = files[i] if i < len(files) else None
        return dict(kind=kind, modality=modality, sample=i, file=name,
                    message=f'{message} (sample {i}: {name})')

    def _identical_check(self, raw_mods, out_mods, i, shapes, flags, files):
        rv, ri = self._raw(raw_mods, 'visible', i), self._raw(
            raw_mods, 'infrared', i)
        ov = _valid_crop(out_mods['visible'], i, shapes[i])
        oi = _valid_crop(out_mods['infrared'], i, shapes[i])
        if rv is not None and ri is not None and rv.shape == ri.shape and \
                torch.equal(rv, ri):
            flags.append(self._flag(
                'identical', 'visible+infrared', i, files,
                'visible and infrared are the same image (the pipeline '
                'delivered identical pixels: check ir_img_path / pairing)'))
            return
        if torch.equal(ov, oi):
            flags.append(self._flag(
                'identical', 'visible+infrared', i, files,
                'visible and infrared are identical after preprocessing'))
            return
        a = ov.float().mean(0).flatten().double()
        b = oi.float().mean(0).flatten().double()
        a, b = a - a.mean(), b - b.mean()
        denom = float(a.norm() * b.norm())
        if denom > 0:
            corr = float((a * b).sum()) / denom
            if corr >= self.identical_corr:
                flags.append(self._flag(
                    'near_identical', 'visible+infrared', i, files,
                    f'visible and infrared are the same image up to '
                    f'brightness/contrast (correlation {corr:.5f})'))

    def _channel_check(self, name, raw_mods, out, shapes, flags,
                       files) -> dict:
        """Channel mapping, mean/std and the resulting channel order."""
        fit = None
        for i in range(out.shape[0]):
            raw = self._raw(raw_mods, name, i)
            if raw is None or not isinstance(raw, torch.Tensor):
                break
            fit = fit_channel_map(raw, _valid_crop(out, i, shapes[i]))
            if fit is not None:
                break
        declared = _declared_swap(self._pre, name)
        info = dict(declared_bgr_to_rgb=declared)
        if fit is None:
            info['channel_order'] = 'not determined (sizes differ after a '\
                'batch resize, constant images, or no raw input)'
            return info
        info.update(fitted_mean=[round(v, 3) for v in fit['mean']],
                    fitted_std=[round(v, 3) for v in fit['std']])
        if fit['mapping'] is None:
            info['channel_order'] = 'grey image (channel order irrelevant)'
            return info
        swapped = {(0, 1, 2): False, (2, 1, 0): True}.get(
            tuple(fit['mapping']))
        if swapped is None:
            info['channel_order'] = f'channels remapped {fit["mapping"]}'
            flags.append(self._flag(
                'channel_conversion', name, 0, files,
                f'{name}: the preprocessor maps raw channels {fit["mapping"]}'
                ' to the model input; expected a plain copy or a BGR<->RGB '
                'swap'))
            return info
        loaded = self.loaded_channel_order
        final = loaded if not swapped else {'bgr': 'rgb',
                                            'rgb': 'bgr'}[loaded]
        info['swapped'] = swapped
        info['channel_order'] = final
        if declared is not None and declared != swapped:
            flags.append(self._flag(
                'channel_conversion', name, 0, files,
                f'{name}: the preprocessor is configured with bgr_to_rgb='
                f'{declared} but {"swaps" if swapped else "keeps"} the '
                'channel order'))
        expected = _order_of_mean(fit['mean'])
        info['mean_order'] = expected
        if expected is not None and expected != final:
            flags.append(self._flag(
                'channel_order', name, 0, files,
                f'{name}: the model receives {final.upper()} images (loaded '
                f'{loaded.upper()}, bgr_to_rgb={swapped}) but the '
                f'normalisation mean {info["fitted_mean"]} is ImageNet\'s in '
                f'{expected.upper()} order; set bgr_to_rgb={not swapped} for '
                f'this modality in the data_preprocessor (heuristic: it '
                'assumes the loader gives '
                f'{loaded.upper()})'))
        return info

    # ------------------------------------------------------------ output
    def _report(self, runner, captured: dict) -> None:
        it = runner.iter + 1
        lines = [f'FirstBatchStatsHook: batch {self._seen} (iter {it}): '
                 f'{captured["batch_size"]} samples, batch input '
                 f'{captured["batch_input_shape"]}']
        for name, m in captured['modalities'].items():
            lines.append(
                f'  {name}: range [{m["min"]:.3f}, {m["max"]:.3f}] mean '
                f'{m["mean"]:.3f} std {m["std"]:.3f} channel means '
                f'{m["channel_mean"]}; order: {m.get("channel_order")}'
                + (f', fitted mean {m["fitted_mean"]} std {m["fitted_std"]}'
                   if 'fitted_mean' in m else ''))
        lines.append(f'  image sizes (h, w): {captured["img_shapes"]}')
        lines.append(f'  boxes per image: {captured["boxes_per_image"]}')
        log('\n'.join(lines))
        record = {k: v for k, v in captured.items()
                  if k not in ('out', 'samples')}
        write_event(runner.work_dir, 'first_batch_stats', iter=it,
                    batch=self._seen, **record)
        for flag in captured['flags']:
            log(f'FirstBatchStatsHook: {flag["kind"]}: {flag["message"]}',
                logging.WARNING)
            fields = dict(flag)
            fields['flag'] = fields.pop('kind')
            write_event(runner.work_dir, 'first_batch_flag', iter=it,
                        **fields)
        self.stats.append(record)
        self.flags += captured['flags']
        update_counters('first_batch_stats', batches=self._seen,
                        flags=len(self.flags),
                        flag_kinds=sorted({f['kind'] for f in self.flags}))

    def _display(self, name: str, img: torch.Tensor, info: dict
                 ) -> np.ndarray:
        """A preprocessed image back to uint8 RGB, as the model sees it."""
        norm = _declared_norm(self._pre, name)
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

    def _visualize(self, runner, captured: dict) -> None:
        from mmsafe.tools_lib.pair_vis import draw_pair
        visualizer = getattr(runner, 'visualizer', None)
        if visualizer is None:
            return
        meta = getattr(visualizer, 'dataset_meta', None) or {}
        classes = tuple(meta.get('classes', ()) or ())
        out, mods = captured['out'], captured['modalities']
        names = list(out)
        for i in range(min(self.max_vis, captured['batch_size'])):
            shape = captured['img_shapes'][i]
            imgs = [self._display(n, _valid_crop(out[n], i, shape), mods[n])
                    for n in names[:2]]
            sample = captured['samples'][i] if captured['samples'] else None
            gt = getattr(sample, 'gt_instances', None)
            canvas = draw_pair(imgs[0], imgs[1] if len(imgs) > 1 else None,
                               getattr(gt, 'bboxes', None),
                               getattr(gt, 'labels', None), classes)
            visualizer.add_image(f'first_batch_pair_{i}', canvas,
                                 step=runner.iter + 1)
