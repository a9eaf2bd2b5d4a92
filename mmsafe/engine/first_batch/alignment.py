"""Image-content alignment of the first visible + infrared pairs.

Each pair, as the pipeline delivers it, is measured with
:func:`mmsafe.tools_lib.pair_alignment.measure_alignment`; a pair whose
infrared image matches its partner mirrored or shifted is flagged at once,
and once enough pairs are measured the partners that match none of them
(``pair_unrelated``) are named.
"""
from typing import Any, List


def _pair_flag(kind: str, result: dict, message: str) -> dict:
    return dict(
        kind=kind, modality='visible+infrared', sample=None,
        file=result.get('file'), ir_file=result.get('ir_file'),
        message=f"{message} (iter {result.get('iter')}: visible="
        f"{result.get('file')} | infrared={result.get('ir_file')}). "
        'Look at the pair with tools/check_dataset.py CONFIG --show-dir '
        'DIR; fix the infrared files or the partner rule, and make '
        'every geometric transform paired')


class PairAlignment:
    """Measures pairs until ``max_pairs`` are seen; then it is ``done``.

    Args:
        max_pairs (int): pairs to measure; 0 measures none.
    """

    def __init__(self, max_pairs: int) -> None:
        self.max_pairs = int(max_pairs)
        self.results: List[dict] = []
        self.done = self.max_pairs <= 0

    def add_batch(self, data_batch: Any, it: int) -> List[dict]:
        """Measure the pairs of a raw data batch (before the preprocessor)
        of iteration ``it``; return the flags they raise (the unrelated
        partners too when this batch completes the measurement)."""
        if self.done:
            return []
        inputs = data_batch.get('inputs') if isinstance(data_batch,
                                                        dict) else None
        if not (isinstance(inputs, dict) and 'visible' in inputs
                and 'infrared' in inputs):
            self.done = True  # not a paired model
            return []
        from mmsafe.tools_lib.pair_alignment import (alignment_flag,
                                                     measure_alignment)
        samples = list(data_batch.get('data_samples') or [])
        flags = []
        for i, (vis, ir) in enumerate(zip(inputs['visible'],
                                          inputs['infrared'])):
            if len(self.results) >= self.max_pairs:
                break
            if tuple(vis.shape[-2:]) != tuple(ir.shape[-2:]):
                continue  # PackPairedDetInputs refuses these already
            meta = samples[i].metainfo if i < len(samples) else {}
            result = measure_alignment(vis, ir)
            result.update(file=meta.get('img_path'),
                          ir_file=meta.get('ir_img_path'), iter=it)
            self.results.append(result)
            if alignment_flag(result):
                flags.append(_pair_flag(f'pair_{result["verdict"]}', result,
                                        result['message']))
        if len(self.results) >= self.max_pairs:
            flags += self.finish()
        return flags

    def finish(self) -> List[dict]:
        """End the measurement; return the ``pair_unrelated`` flags of the
        pairs measured (empty when it had ended already)."""
        if self.done:
            return []
        self.done = True
        from mmsafe.tools_lib.pair_alignment import (unrelated_message,
                                                     unrelated_pairs)
        return [
            _pair_flag('pair_unrelated', self.results[i],
                       unrelated_message(self.results[i], self.results))
            for i in unrelated_pairs(self.results)
        ]
