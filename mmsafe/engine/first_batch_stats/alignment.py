"""Image-content alignment of the first visible + infrared pairs.

Each pair, as the pipeline delivers it, is measured with
:func:`mmsafe.analysis.pair_alignment.measure_alignment`; a pair whose
infrared image matches its partner mirrored or shifted is flagged at once,
and once enough pairs are measured the partners that match none of them
(``pair_unrelated``) are named. The per-box visible/infrared offsets of
the same pairs (:mod:`mmsafe.analysis.object_offsets`, the boxes of the
data samples' ``gt_instances``) flag a pair whose people are offset
beyond ``max_offset`` pixels (``pair_objects_offset``); their distribution
is logged when the measurement ends.

A pair of which one modality is nearly constant
(:func:`mmsafe.analysis.flat_images.near_constant`:
nothing to align, e.g. a 16-bit frame cut to its high byte) is not
judged: the pairing checks abstain on it, count it and say so when the
measurement ends; ``FirstBatchStatsHook`` flags the modality itself. So
is a pair whose two images are one image (a missing partner filled with
the visible image; flagged ``identical``).
"""
from typing import Any, List, Optional, Sequence

from mmsafe.analysis.object_offsets import (FINDING, audit_offsets,
                                            format_summary, offsets_message,
                                            offsets_summary)
from mmsafe.analysis.pair_alignment import (alignment_flag,
                                            measure_alignment,
                                            unrelated_message,
                                            unrelated_pairs)
from mmsafe.analysis.flat_images import NEAR_CONSTANT_STD, near_constant
from mmsafe.events import log


def same_image(visible: Any, infrared: Any) -> bool:
    """Whether the two images of a pair are one image (equal values)."""
    import torch
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
