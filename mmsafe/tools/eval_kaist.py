"""Score KAIST detection files with a config's dataset and evaluator, as the
KAIST devkit scores them, to place a model beside a paper's table::

    python tools/eval_kaist.py CONFIG DETECTIONS [--split test|val]
        [--data-root DIR] [--cfg-options k=v ...] [--out OUT.json]

DETECTIONS is a combined file (``id,x,y,w,h,score`` per line, ``id`` the
1-based index of the frame in the split's list sorted by name: the
``*_result.txt`` files papers publish) or a folder with one file per frame
(``set06_V000_I00019.txt``: ``x y w h score`` or ``person x1 y1 x2 y2
score`` lines). Only the annotations are read, not the images. The split's
frames and annotations are the config's (e.g. ``--cfg-options
test_dataloader.dataset.data_prefix.ann=annotations_KAIST_test_set/`` for
the improved test annotations). With the KAIST config the keys are
``kaist/MR-2`` (reasonable, every frame), ``kaist/MR-2_day``,
``kaist/MR-2_night``, ``kaist/MR-2_all`` ...

Exit code: 0 after scoring, 2 when the dataset, the evaluator or the
detections cannot be read.
"""
import argparse
import json
import math
import os.path as osp
import sys

def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='Score detection files in the KAIST devkit formats')
    parser.add_argument('config', help='config file (e.g. a configs/kaist/ '
                        'one)')
    parser.add_argument('detections', help='combined detection file or '
                        'per-frame folder')
    parser.add_argument('--split', choices=['test', 'val'], default='test',
                        help='whose dataset and evaluator (default test)')
    parser.add_argument('--data-root', help="the split dataset's data_root")
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings in the config, key=value')
    parser.add_argument('--out', metavar='OUT.json',
                        help='also write the metrics here')
    return parser.parse_args(argv)


def build(cfg, split: str, data_root=None):
    """The split's dataset (annotations only) and evaluator."""
    from mmengine.evaluator import Evaluator
    from mmengine.registry import init_default_scope

    from mmdet.registry import DATASETS
    init_default_scope(cfg.get('default_scope', 'mmdet'))
    dataset_cfg = cfg[f'{split}_dataloader']['dataset'].copy()
    if data_root is not None:
        dataset_cfg['data_root'] = data_root
    dataset_cfg.update(pipeline=[], require_images=False, test_mode=True)
    dataset = DATASETS.build(dataset_cfg)
    evaluator = Evaluator(cfg[f'{split}_evaluator'])
    evaluator.dataset_meta = dataset.metainfo
    return dataset, evaluator


def main(argv=None) -> int:
    args = parse_args(argv)
    from mmsafe.tools_lib.cli import read_config

    import mmsafe  # noqa: F401  (registers the dataset and the metrics)
    from mmsafe.evaluation.kaist_det_files import missing_frame_files
    from mmsafe.evaluation.kaist_scoring import score_detections
    cfg = read_config(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
    try:
        dataset, evaluator = build(cfg, args.split, args.data_root)
        ids = [dataset.get_data_info(i)['img_id']
               for i in range(len(dataset))]
        if osp.isdir(args.detections):
            absent = missing_frame_files(args.detections, ids)
            if absent:
                print(f'eval_kaist: {len(absent)} of {len(ids)} frames have '
                      f'no file in {args.detections} (scored as no '
                      f'detections), e.g. {absent[0]}')
        metrics = score_detections(dataset, evaluator, args.detections)
    except (OSError, ValueError, KeyError) as err:
        print(f'eval_kaist: {type(err).__name__}: {err}', file=sys.stderr)
        return 2
    print(f'eval_kaist: {args.detections} on {len(ids)} frames of '
          f'{dataset.ann_file}')
    for key, value in metrics.items():
        shown = (f'{value * 100:.2f}%' if 'MR-2' in key and not
                 math.isnan(value) else f'{value}')
        print(f'  {key:<24} {shown}')
    if args.out:
        with open(args.out, 'w', encoding='utf-8') as f:
            json.dump(metrics, f, indent=1)
    return 0


def console_main() -> int:
    """The ``mmsafe-eval-kaist`` command."""
    return main()


if __name__ == '__main__':
    sys.exit(console_main())
