"""Log what the model really receives in the first batches of a run.

Unit and normalisation faults (a modality that is all zeros, the visible
image loaded twice, BGR fed to an RGB-pretrained backbone) do not raise;
the statistics of the first batches, taken at the output of the data
preprocessor, show them before the first log interval. The computations
live in :mod:`mmsafe.engine.hooks.first_batch_checks`; this hook collects
the batches and reports.
"""
import logging
from typing import Any, List, Optional

import torch
from mmengine.hooks import Hook

from mmsafe.registry import HOOKS
from mmsafe.analysis.flat_images import NEAR_CONSTANT_STD
from mmsafe.engine.guard_status import (ACTIVE, INACTIVE, PARTIAL,
                                        status_of)
from mmsafe.engine.hooks.first_batch_checks import (PairAlignment,
                                                    analyse_batch,
                                                    valid_crop,
                                                    visualize_pairs)
from mmsafe.engine.modalities import (DECLARE_HINT, infrared_results_key,
                                      looked_for, modalities_of,
                                      pipeline_geometry)
from mmsafe.engine.utils import unwrap_model
from mmsafe.modalities import BATCH_INPUTS, MODEL_INPUTS
from mmsafe.errors import MMSafeRuntimeError, MMSafeValueError
from mmsafe.guard_outputs import CounterKey, Event, GuardOutputs, Section
from mmsafe.events import log, update_counters, write_event


@HOOKS.register_module()
class FirstBatchStatsHook(Hook):
    """Log per-modality statistics of the first training batches after the
    data preprocessor, flag broken inputs, and show the first pairs.

    For each of the first ``num_batches`` iterations it logs, per modality
    (``visible`` / ``infrared``; ``img`` for a single-modality model), the
    value range, mean and std over the valid (unpadded) pixels, the
    per-channel means, the image sizes and the boxes per image. It flags
    (see :func:`~mmsafe.engine.hooks.first_batch_checks.analyse_batch`):

    * ``all_zero`` and ``constant``: a modality that is all zeros, or
      constant in an image, after preprocessing;
    * ``nearly_constant``: a modality whose raw values (as the pipeline
      delivers them) have a standard deviation below ``near_constant_std``
      in an image (a 16-bit thermal frame decoded to 8 bits keeps its high
      byte: 3 grey levels). It is flagged before any pairing verdict, and
      the pairing checks below abstain on such a pair (counted and logged);
    * ``swapped``: a grey visible image beside a colour infrared one (the
      two exchanged);
    * ``identical`` / ``near_identical``: visible and infrared are the same
      image (up to brightness/contrast: grey-image correlation >=
      ``identical_corr``);
    * ``channel_conversion``: the preprocessor swaps (or keeps) the channel
      order against its own ``bgr_to_rgb`` setting;
    * ``channel_order``: the model receives one order while the
      preprocessor's mean is ImageNet's mean in the other order. This is a
      heuristic and says so: it assumes the loader produced
      ``loaded_channel_order`` and judges only when the fitted mean is
      recognisably ImageNet's (123.675, 116.28, 103.53) in RGB or BGR
      order; grey images and batches that a batch augmentation resized are
      skipped.

    Pair alignment (``alignment=True``): the first ``alignment_pairs``
    pairs, as the pipeline delivers them, are measured with
    :func:`mmsafe.analysis.pair_alignment.measure_alignment`. A pair whose
    infrared image matches its partner mirrored (``pair_mirrored``) or
    shifted (``pair_shifted``) is a warning naming both files; when hardly
    any of those pairs matches at all, the partners are from other frames
    (``pair_unrelated``). It costs a few milliseconds per pair. The same
    pairs' boxes (``gt_instances.bboxes``) are measured one by one
    (:mod:`mmsafe.analysis.object_offsets`): a pair whose people are
    offset between visible and infrared by more than ``max_offset``
    pixels (median over its boxes, original resolution) is a
    ``pair_objects_offset`` warning (an infrared partner from another
    moment, or unregistered modalities); the distribution of the offsets
    is logged once the pairs are measured.

    Where the two images are, before and after the preprocessor, and which
    meta keys name their files, comes from the run's modalities
    (:func:`mmsafe.engine.modalities.modalities_of`: the config's
    ``mmsafe_modalities``, the components' declarations, or the common
    layouts recognised: a dict, a list of two, a 6/4-channel tensor, a
    data-sample field). The pairs are measured as the pipeline delivered
    them when the infrared image is found in the batch, else as the model
    receives them. Without an infrared image the pairing checks say so
    once and only the one image's statistics are logged. A training
    pipeline that is not mmsafe's ``PairedCompose`` records no
    per-modality geometry: said once in ``before_train``, with what the
    content checks cover instead. :meth:`guard_status` tells the safety
    report which of these checks ran.

    The statistics come from a forward hook on the model's
    ``data_preprocessor`` (exactly what the model's ``loss`` receives); the
    first batch's pairs (up to ``max_vis``), with their boxes, are sent to
    the visualizer's backends (``runner.visualizer.add_image``) as the
    model sees them, converted back to RGB.

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
        max_offset (float): per-box offset (pixels of the original
            images, median over a pair's boxes) above which a pair is
            flagged. Defaults to 8.
        near_constant_std (float): raw standard deviation (grey levels of
            0-255 data) below which a modality is nearly constant.
            Defaults to 2.
    """

    guard_outputs = GuardOutputs(
        Section.OTHER,
        events=(Event.FIRST_BATCH_STATS, Event.FIRST_BATCH_FLAG),
        counters=(CounterKey.FIRST_BATCH_STATS, ))

    priority = 'NORMAL'

    def __init__(self,
                 num_batches: int = 1,
                 max_vis: int = 4,
                 on_fault: str = 'warn',
                 constant_eps: float = 1e-6,
                 identical_corr: float = 0.9999,
                 loaded_channel_order: str = 'bgr',
                 alignment: bool = True,
                 alignment_pairs: int = 16,
                 max_offset: float = 8.0,
                 near_constant_std: float = NEAR_CONSTANT_STD) -> None:
        if on_fault not in ('warn', 'raise'):
            raise MMSafeValueError(f"on_fault must be 'warn' or 'raise', got "
                                   f'{on_fault!r}')
        if loaded_channel_order not in ('bgr', 'rgb'):
            raise MMSafeValueError(
                "loaded_channel_order must be 'bgr' or 'rgb'")
        self.num_batches = int(num_batches)
        self.max_vis = int(max_vis)
        self.on_fault = on_fault
        self.constant_eps = float(constant_eps)
        self.identical_corr = float(identical_corr)
        self.loaded_channel_order = loaded_channel_order
        self.alignment = bool(alignment)
        self.alignment_pairs = int(alignment_pairs)
        self.near_constant_std = float(near_constant_std)
        self._pairs = PairAlignment(self.alignment_pairs if self.alignment
                                    else 0, max_offset,
                                    self.near_constant_std)
        self._handle = None
        self._armed = False
        self._captured: Optional[dict] = None
        self._seen = 0
        self._pre = None
        self._modalities = None
        # where the pairs are measured: BATCH_INPUTS, MODEL_INPUTS, None
        # (no infrared found), or '' (not known before the first batch)
        self._pair_side: Optional[str] = ''
        self._model_pairs: Optional[tuple] = None
        self._geometry = (False, 'not looked at')
        self._skipped: Optional[str] = None
        self.flags: List[dict] = []
        self.stats: List[dict] = []

    @property
    def alignments(self) -> List[dict]:
        """The alignment measurements of the pairs seen so far."""
        return self._pairs.results

    @property
    def object_offsets(self) -> List[dict]:
        """The per-box offsets of the pairs with boxes seen so far."""
        return self._pairs.offsets

    @property
    def abstained_pairs(self) -> List[dict]:
        """The pairs the pairing checks did not judge (a modality nearly
        constant, or one image twice): files, iteration and the flat
        modalities (none for one image twice)."""
        return self._pairs.abstained

    @property
    def object_offset_summary(self) -> Optional[dict]:
        """Their distribution, once the pairs are measured."""
        return self._pairs.offset_summary

    def before_train(self, runner) -> None:
        self._modalities = modalities_of(runner)
        self._geometry = pipeline_geometry(runner)
        if not self._geometry[0]:
            log('FirstBatchStatsHook: the pair-geometry check is off for '
                'this run: the training pipeline '
                f'({self._geometry[1]}) is not mmsafe\'s PairedCompose, so '
                'its transforms do not record what they do to each '
                f'modality (the infrared image in '
                f'{infrared_results_key(self._modalities)}) and a '
                'transform that moves one modality only is not named. The '
                'content check covers instead: the first '
                f'{self.alignment_pairs if self.alignment else 0} pairs '
                'the model receives are measured for a mirrored, shifted or '
                'unrelated infrared image and for per-box offsets (a '
                'one-sided flip, crop or shift shows there; a one-sided '
                'resize, rotation or photometric change may not).',
                logging.WARNING)
        self._pre = getattr(unwrap_model(runner.model), 'data_preprocessor',
                            None)
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
        self._model_pairs = None

    def _capture(self, module, args, kwargs, output) -> None:
        # Invariant: only the first preprocessor call between
        # before_train_iter and after_train_iter (train_step's) is read.
        if self._captured is not None or self._model_pairs is not None:
            return
        data = args[0] if args else kwargs.get('data')
        if self._armed:
            with torch.no_grad():
                self._captured = self._analyse(data, output)
        if self._pair_side == MODEL_INPUTS and not self._pairs.done:
            # the pairs exist only after the preprocessor: keep this
            # iteration's (detached, unpadded) for the pairing checks
            out = self._modalities.images(MODEL_INPUTS, output)
            samples = list(output.get('data_samples') or [])
            shapes = [s.metainfo.get('img_shape') for s in samples]
            self._model_pairs = tuple(
                [valid_crop(img.detach(), shapes[i] if i < len(shapes)
                            else None) for i, img in enumerate(out[n])]
                for n in ('visible', 'infrared')) + (samples, )

    def _files(self, samples: list) -> tuple:
        """The visible and the infrared file of each sample."""
        if not samples:
            return [], []
        keys = self._modalities.files(samples[0].metainfo)
        return ([s.metainfo.get(keys['visible']) if keys['visible'] else
                 None for s in samples],
                [s.metainfo.get(keys['infrared']) if keys['infrared'] else
                 None for s in samples])

    def _analyse(self, data: dict, output: dict) -> dict:
        """The statistics of one batch; ``dict(skipped=why)`` when no image
        is found in it (before or after the preprocessor)."""
        raw = self._modalities.images(BATCH_INPUTS, data)
        out = self._modalities.images(MODEL_INPUTS, output)
        if not out:
            out = raw  # nothing recognisable after the preprocessor
        self._settle_pair_side(raw, out)
        if not out:
            return dict(skipped=self._modalities.not_found(MODEL_INPUTS)
                        or 'nothing recognisable')
        samples = list((output if isinstance(output, dict) else {}).get(
            'data_samples') or data.get('data_samples') or [])
        files, ir_files = self._files(samples)
        return analyse_batch(raw, out, samples, self._pre,
                             self.constant_eps, self.identical_corr,
                             self.loaded_channel_order,
                             self.near_constant_std, files, ir_files)

    def _settle_pair_side(self, raw: dict, out: dict) -> None:
        """Where the pairing checks read the pairs (decided at the first
        batch, the same on every rank): as the pipeline delivered them
        when the infrared image is found there, else as the model receives
        them; none when no infrared image is found."""
        if self._pair_side != '':
            return
        if 'infrared' in raw:
            self._pair_side = BATCH_INPUTS
        elif 'infrared' in out:
            self._pair_side = MODEL_INPUTS
            log('FirstBatchStatsHook: the infrared image is found only in '
                'what the model receives, not in the batch before the data '
                'preprocessor: the pairing checks measure the preprocessed '
                'images (a nearly constant modality is not judged there)',
                logging.INFO)
        else:
            self._pair_side = None
            self._pairs.done = True
            seen = self._modalities.not_found(MODEL_INPUTS) or \
                self._modalities.not_found(BATCH_INPUTS)
            log('FirstBatchStatsHook: the pairing checks (identical, '
                'swapped or blank modality; mirrored, shifted or unrelated '
                'infrared image; per-box offsets) are off for this run: no '
                f'infrared image was found ({seen}; looked for '
                f'{looked_for()}); only the statistics '
                f'of the one image are logged. If the model is paired, '
                f'{DECLARE_HINT}.', logging.WARNING)

    def after_train_iter(self, runner, batch_idx: int,
                         data_batch: Any = None, outputs=None) -> None:
        it = runner.iter + 1
        # the batch's own flags (a nearly constant modality) before any
        # pairing verdict on it
        if self._armed:
            self._report_batch(runner, data_batch, it)
        self._report_pair_flags(runner, self._add_pairs(data_batch, it))

    def _add_pairs(self, data_batch: Any, it: int) -> List[dict]:
        """Hand this iteration's pairs to the pairing checks."""
        if self._pairs.done or not isinstance(data_batch, dict):
            return []
        if self._pair_side == '':
            raw = self._modalities.images(BATCH_INPUTS, data_batch)
            self._settle_pair_side(raw, {})
        if self._pair_side == BATCH_INPUTS:
            raw = self._modalities.images(BATCH_INPUTS, data_batch)
            if 'infrared' not in raw:
                return []
            samples = list(data_batch.get('data_samples') or [])
            files, ir_files = self._files(samples)
            return self._pairs.add_pairs(raw['visible'], raw['infrared'],
                                         samples, files, ir_files, it)
        if self._pair_side == MODEL_INPUTS and self._model_pairs:
            vis, ir, samples = self._model_pairs
            self._model_pairs = None
            files, ir_files = self._files(samples)
            flags = self._pairs.add_pairs(vis, ir, samples, files, ir_files,
                                          it, raw=False)
            if self._pairs.done and self._seen >= self.num_batches:
                self._remove()
            return flags
        return []

    def _report_batch(self, runner, data_batch: Any, it: int) -> None:
        """Report the statistics of an armed iteration's batch."""
        self._armed = False
        captured, self._captured = self._captured, None
        if captured is None:
            log('FirstBatchStatsHook: the data_preprocessor was not called '
                f'through its forward in iteration {it}; running it once '
                'more on the batch (training=False) for the statistics',
                logging.WARNING)
            with torch.no_grad():
                captured = self._analyse(
                    data_batch, self._pre(dict(data_batch), False))
        if 'skipped' in captured:
            log('FirstBatchStatsHook: no image was found in the batch or in '
                f'what the model receives ({captured["skipped"]}; looked for '
                f'{looked_for()}, or 3-channel inputs): no first-batch '
                f'statistics for this run; {DECLARE_HINT}', logging.WARNING)
            self._skipped = captured['skipped']
            self._seen = self.num_batches
            self._remove()
            return
        self._seen += 1
        self._report(runner, captured)
        visualizer = getattr(runner, 'visualizer', None)
        if self._seen == 1 and self.max_vis > 0 and visualizer is not None:
            visualize_pairs(visualizer, self._pre, captured, self.max_vis,
                            step=it)
        if self._seen >= self.num_batches and (
                self._pair_side != MODEL_INPUTS or self._pairs.done):
            self._remove()
        if captured['flags'] and self.on_fault == 'raise':
            raise MMSafeRuntimeError(
                'FirstBatchStatsHook: broken inputs in the first batch: ' +
                '; '.join(f['message'] for f in captured['flags']) +
                " (on_fault='warn' only logs them)")

    def guard_status(self, runner) -> dict:
        """What this hook could check in this run, per check (see
        :mod:`mmsafe.engine.modalities`)."""
        checks = {}
        if self._pre is None:
            checks['statistics'] = dict(
                status=INACTIVE, detail='the model has no data_preprocessor')
        elif self.stats:
            mods = sorted(self.stats[0]['modalities'])
            checks['statistics'] = dict(
                status=ACTIVE, detail=f'{len(self.stats)} batch(es) of '
                f'{"/".join(mods)}')
        else:
            checks['statistics'] = dict(
                status=INACTIVE, detail=f'no image found ({self._skipped}): '
                f'{DECLARE_HINT}' if self._skipped else
                'no training batch was analysed')
        if self._pair_side in (BATCH_INPUTS, MODEL_INPUTS):
            where = ('as the pipeline delivered them'
                     if self._pair_side == BATCH_INPUTS else
                     'as the model receives them, preprocessed')
            measured = len(self.alignments)
            checks['pairing content'] = dict(
                status=ACTIVE if measured else PARTIAL,
                detail=f'identical/swapped/blank on the first batch; '
                f'{measured} pair(s) measured {where} for mirrored, '
                f'shifted or unrelated infrared images, '
                f'{len(self.object_offsets)} with per-box offsets')
        elif self._pair_side is None:
            checks['pairing content'] = dict(
                status=INACTIVE, detail='no infrared image found: '
                f'{DECLARE_HINT}')
        else:
            checks['pairing content'] = dict(
                status=INACTIVE, detail='no training batch was seen')
        recorded, what = self._geometry
        checks['pair geometry'] = dict(
            status=ACTIVE if recorded else INACTIVE,
            detail='PairedCompose names a transform that moves one '
            'modality' if recorded else f'{what} records no per-modality '
            'geometry; the pairing content check covers one-sided flips '
            'and shifts')
        return status_of(checks)

    def after_train(self, runner) -> None:
        self._remove()
        self._report_pair_flags(runner, self._pairs.finish())

    def _remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None

    def _report(self, runner, captured: dict) -> None:
        """Log and record the statistics of one analysed batch."""
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
        write_event(runner.work_dir, Event.FIRST_BATCH_STATS, iter=it,
                    batch=self._seen, **record)
        self.stats.append(record)
        self._emit_flags(runner, captured['flags'])

    def _report_pair_flags(self, runner, flags: List[dict]) -> None:
        self._emit_flags(runner, flags)
        if flags and self.on_fault == 'raise':
            raise MMSafeRuntimeError(
                'FirstBatchStatsHook: misaligned pairs: ' +
                '; '.join(f['message'] for f in flags) +
                " (on_fault='warn' only logs them)")

    def _emit_flags(self, runner, flags: List[dict]) -> None:
        """Log each flag, write it as a ``first_batch_flag`` event and
        publish the ``mmsafe/first_batch_stats`` counters."""
        for flag in flags:
            log(f'FirstBatchStatsHook: {flag["kind"]}: {flag["message"]}',
                logging.WARNING)
            fields = dict(flag)
            fields['flag'] = fields.pop('kind')
            write_event(runner.work_dir, Event.FIRST_BATCH_FLAG,
                        iter=runner.iter + 1, **fields)
        self.flags += flags
        if flags or self.stats:
            update_counters(CounterKey.FIRST_BATCH_STATS, batches=self._seen,
                            flags=len(self.flags),
                            flag_kinds=sorted({f['kind']
                                               for f in self.flags}))
