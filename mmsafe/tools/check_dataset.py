"""Check a paired detection dataset before training on it.

Builds the split's dataset from the config exactly as training does, walks
every sample through its pipeline in a DataLoader with worker processes, and
reports missing or unreadable partner images, size mismatches between the
modalities, samples with no valid instances after the pipeline, degenerate or
out-of-image boxes (each image with its own size), negative coordinates, a
coordinate base that the boxes at the image borders contradict, labels
outside the class range, every malformed annotation file (file, element and
line; all of them in one run), and object names that are not classes
(counted per name, with the class that differs only in case or
spacing)::

    python tools/check_dataset.py CONFIG [--split train|val|test]
        [--cfg-options k=v ...] [--json OUT.json] [--workers N]
        [--show-dir DIR [--show N]] [--strict] [--max-offset PX]
        [--files LIST]
    python tools/check_dataset.py CONFIG --stats [--stats-samples N]
        [--workers N] [--json OUT.json]

``--files`` checks only the samples that a file names: a training run's
``mmsafe_events.jsonl`` (the images of its skipped steps and rollbacks),
its ``safety_report.json`` (the repeated offenders) or a list of paths.

``--stats`` computes each modality's per-channel mean and std over the
split's images as loaded, their bit depth and value range, and prints the
PairedDetDataPreprocessor lines.

Exit code: 0 when no error was found (warnings allowed unless --strict),
1 when at least one sample has an error, 2 when the dataset cannot be built.
"""
import argparse
import json
import logging
import os
import os.path as osp
import sys

def parse_args(argv=None):
    from mmengine.config import DictAction
    parser = argparse.ArgumentParser(
        description='Audit a (paired) detection dataset through its '
        'pipeline')
    parser.add_argument('config', help='config file (as for training)')
    parser.add_argument('--split', choices=['train', 'val', 'test'],
                        default='train', help='which dataloader to check')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override settings in the config, key=value')
    parser.add_argument('--json', metavar='OUT',
                        help='write the full report (every finding) here')
    parser.add_argument('--show-dir', metavar='DIR',
                        help='write "visible | infrared" images with boxes, '
                        'as the pipeline outputs them (after augmentation)')
    parser.add_argument('--show', type=int, default=20, metavar='N',
                        help='how many samples to draw (default 20)')
    parser.add_argument('--workers', type=int,
                        default=min(8, os.cpu_count() or 1),
                        help='DataLoader worker processes (0: in-process)')
    parser.add_argument('--limit', type=int,
                        help='check only the first N samples')
    parser.add_argument('--files', metavar='LIST',
                        help='check only the samples whose visible or '
                        'infrared image LIST names: a training run\'s '
                        'mmsafe_events.jsonl (the images of its skipped '
                        'steps and rollbacks), its safety_report.json (the '
                        'repeated offenders), or a text file with one path '
                        'per line')
    parser.add_argument('--box-tolerance', type=float, default=1.0,
                        help='pixels a box may reach past the image border '
                        'as a warning (box_past_border) before it is an '
                        'error (out_of_image_box), unless that is within a '
                        'quarter of its own width/height; default 1')
    parser.add_argument('--seed', type=int, default=0,
                        help='seed of the random augmentations')
    parser.add_argument('--strict', action='store_true',
                        help='exit non-zero on warnings too (e.g. samples '
                        'without valid instances)')
    parser.add_argument('--no-progress', action='store_true',
                        help='no progress bar')
    # pairing: image-content alignment of every pair
    parser.add_argument('--no-alignment', action='store_true',
                        help='skip the visible/infrared alignment measures '
                        '(whole images and per-box offsets)')
    parser.add_argument('--max-offset', type=float, default=8.0,
                        metavar='PX',
                        help='flag a pair whose boxes are offset between '
                        'visible and infrared by more than PX pixels '
                        '(median over its boxes, original resolution; '
                        'default 8)')
    # --stats: a separate mode (mmsafe/tools_lib/dataset_stats.py)
    parser.add_argument('--stats', action='store_true',
                        help='instead of the audit: per-channel mean/std of '
                        'each modality as loaded, printed as '
                        'PairedDetDataPreprocessor lines (--json: save them)')
    parser.add_argument('--stats-samples', type=int, metavar='N',
                        help='with --stats: N evenly spaced pairs only')
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    import mmsafe  # noqa: F401  registers the paired datasets/transforms
    from mmengine.logging import print_log
    from mmengine.runner import set_random_seed

    from mmsafe.tools_lib import dataset_check as dc
    from mmsafe.tools_lib.cli import read_config, warn_unreached_data_root

    cfg = read_config(args.config)
    if args.cfg_options:
        cfg.merge_from_dict(args.cfg_options)
        warn_unreached_data_root(cfg, args.cfg_options)
    set_random_seed(args.seed)
    if args.stats:
        from mmsafe.tools_lib.dataset_stats import run_stats
        run_stats(cfg, args.split, args.stats_samples, args.workers,
                  not args.no_progress, args.json)
        return 0
    try:
        dc.dataset_config(cfg, args.split)
    except KeyError as exc:
        print_log(f'[mmsafe] check_dataset: {exc}', logger='current',
                  level=logging.ERROR)
        return 2
    # pairing: transforms acting on one modality, from the config alone
    static = dc.static_findings(cfg, args.split)
    try:
        dataset, findings = dc.build_dataset(cfg, args.split)
    except Exception as exc:  # noqa: BLE001 - reported, exit code 2
        report = dc.add_findings(dc.build_failure_report(
            exc, dc.dataset_config(cfg, args.split)), static)
        dataset = None
    indices = None
    if dataset is not None and args.files:
        from mmsafe.tools_lib.dataset_check.file_list import (
            read_file_list, select_indices)
        indices, unmatched = select_indices(dataset,
                                            read_file_list(args.files))
        print_log(f'[mmsafe] check_dataset --files: {len(indices)} samples '
                  f'of the {args.split} split named in {args.files}' +
                  (f'; not in the split: {unmatched[:10]}' +
                   (f' and {len(unmatched) - 10} more'
                    if len(unmatched) > 10 else '') if unmatched else ''),
                  logger='current',
                  level=logging.WARNING if unmatched else logging.INFO)
    if dataset is not None:
        report = dc.audit(
            dataset,
            workers=args.workers,
            show_dir=args.show_dir,
            show=args.show if args.show_dir else 0,
            box_tolerance=args.box_tolerance,
            limit=args.limit,
            progress=not args.no_progress,
            seed=args.seed,
            findings=static + findings,
            alignment=not args.no_alignment,
            max_offset=args.max_offset,
            indices=indices)
        report['annotations'] = dc.annotation_summary(dataset)
    report.update(config=args.config, split=args.split)
    if dataset is None:
        code = 2
    elif report['errors'] or (args.strict and report['warnings']):
        code = 1
    else:
        code = 0
    report['exit_code'] = code
    print(dc.format_report(report), flush=True)
    if args.json:
        os.makedirs(osp.dirname(osp.abspath(args.json)), exist_ok=True)
        with open(args.json, 'w', encoding='utf-8') as f:
            json.dump(report, f, indent=1)
        print(f'report written to {args.json}')
    if report['shown']:
        print(f"{len(report['shown'])} pair images written to "
              f'{args.show_dir}')
    verdict = {0: 'OK', 1: 'FAILED', 2: 'DATASET NOT BUILT'}[code]
    print(f'check_dataset: {verdict} ({report["errors"]} errors, '
          f'{report["warnings"]} warnings)')
    return code


def console_main() -> int:
    """The ``mmsafe-check-dataset`` command."""
    return main()


if __name__ == '__main__':
    sys.exit(console_main())
