"""The audit report: aggregate per-sample records, format the summary,
add dataset-level findings."""
import traceback
from collections import Counter
from typing import Dict, List, Sequence

import numpy as np

from .checks import CHECKS, ERROR, WARNING, class_names, issue


def summarize(records: List[dict], elapsed: float, workers: int,
              dataset=None, findings: Sequence[dict] = ()) -> dict:
    """Aggregate per-sample records into the report dict."""
    counts: Dict[str, int] = Counter(i['kind'] for i in findings)
    issues = [dict(i) for i in findings]
    # a file listed from the folders may also be in the dataset: once only
    seen = {(i['kind'], i.get('path')) for i in findings if i.get('path')}
    for r in records:
        for i in r['issues']:
            if i.get('path') and (i['kind'], i['path']) in seen:
                continue
            counts[i['kind']] += 1
            entry = dict(index=r['index'], img_path=r.get('img_path'),
                         ir_img_path=r.get('ir_img_path'))
            entry.update(i)
            issues.append(entry)
    boxes = [r['boxes'] for r in records if 'boxes' in r]
    sizes = Counter(tuple(r['raw_size']) for r in records
                    if r.get('raw_size'))
    report = dict(
        dataset=type(dataset).__name__ if dataset is not None else None,
        classes=list(class_names(dataset)) if dataset is not None else [],
        num_samples=len(records),
        elapsed_s=round(elapsed, 3),
        pairs_per_second=round(len(records) / elapsed, 2) if elapsed else
        None,
        workers=workers,
        summary={
            k: dict(severity=CHECKS[k][0], findings=counts[k],
                    meaning=CHECKS[k][1])
            for k in CHECKS if counts[k]
        },
        errors=sum(1 for i in issues if i['severity'] == ERROR),
        warnings=sum(1 for i in issues if i['severity'] == WARNING),
        boxes_after_pipeline=dict(
            total=int(sum(boxes)), mean=round(float(np.mean(boxes)), 3)
            if boxes else None, max=int(max(boxes)) if boxes else None),
        image_sizes={f'{w}x{h}': c
                     for (w, h), c in sizes.most_common(10)},
        shown=[r['shown'] for r in records if r.get('shown')],
        issues=issues)
    return report


def build_failure_report(exc: BaseException, dataset_cfg) -> dict:
    """A report for a dataset that could not even be built."""
    report = summarize([], 0.0, 0)
    report['dataset'] = (dataset_cfg.get('type') if hasattr(
        dataset_cfg, 'get') else None)
    entry = issue('dataset_build', f'{type(exc).__name__}: {exc}', 'dataset',
                  traceback=traceback.format_exc(limit=12))
    report['issues'] = [dict(index=None, img_path=None, ir_img_path=None,
                             **entry)]
    report['summary'] = {'dataset_build': dict(
        severity=ERROR, findings=1, meaning=CHECKS['dataset_build'][1])}
    report['errors'] = 1
    return report


def format_report(report: dict, max_examples: int = 5) -> str:
    """Human-readable summary table plus a few examples per finding."""
    lines = []
    rate = report.get('pairs_per_second')
    lines.append(
        f"dataset {report.get('dataset')}: {report['num_samples']} samples "
        f"checked in {report['elapsed_s']:.1f} s "
        f"({rate if rate is not None else '-'} pairs/s, "
        f"{report['workers']} workers); classes {report.get('classes')}")
    header = f"{'check':<26}{'severity':<10}{'found':>8}  meaning"
    lines += [header, '-' * len(header)]
    for kind, (severity, meaning) in CHECKS.items():
        n = report['summary'].get(kind, {}).get('findings', 0)
        mark = '' if n == 0 else ' <--'
        lines.append(f'{kind:<26}{severity:<10}{n:>8}  {meaning}{mark}')
    lines.append('-' * len(header))
    box = report.get('boxes_after_pipeline') or {}
    lines.append(f"errors: {report['errors']}  warnings: "
                 f"{report['warnings']}  boxes after pipeline: "
                 f"{box.get('total')} (mean {box.get('mean')} per image)  "
                 f"image sizes: {report.get('image_sizes')}")
    if report.get('box_borders'):
        from .coordinates import format_borders
        lines += format_borders(report['box_borders'])
    lines += format_annotations(report.get('annotations') or [])
    if report.get('object_offsets') is not None:
        from mmsafe.analysis.object_offsets import format_summary
        lines.append(format_summary(report['object_offsets']))
        if report['object_offsets'].get('histogram'):
            lines.append('  histogram of |d|: '
                         f"{report['object_offsets']['histogram']}")
    by_kind: Dict[str, list] = {}
    for i in report['issues']:
        by_kind.setdefault(i['kind'], []).append(i)
    for kind, found in by_kind.items():
        lines.append(f'[{found[0]["severity"]}] {kind}: {len(found)}')
        for i in found[:max_examples]:
            files = ' | '.join(
                str(p) for p in (i.get('img_path'), i.get('ir_img_path'))
                if p) or (i.get('path') or '')
            where = '-' if i['index'] is None else f"#{i['index']}"
            lines.append(f'  {where} {files}: {i["message"]}')
        if len(found) > max_examples:
            lines.append(f'  ... {len(found) - max_examples} more in the '
                         'JSON report (--json)')
    return '\n'.join(lines)


def format_annotations(tallies: Sequence[dict]) -> List[str]:
    """One line per leaf dataset: what its annotation files held (see
    :class:`~mmsafe.datasets.annotation_tally.AnnotationTally`)."""
    lines = []
    for t in tallies:
        parts = [f"{t['files']} files, {t['objects']} objects read"]
        for field, entry in t['defaults'].items():
            parts.append(f"{field} without a value {entry['count']}x, read "
                         f"as {entry['default']}")
        if t['unknown']:
            count = sum(e['count'] for e in t['unknown'].values())
            names = ', '.join(f"{n!r} x{e['count']}" for n, e in sorted(
                t['unknown'].items(), key=lambda kv: -kv[1]['count']))
            parts.append(f'{count} objects {t["unknown_fate"]}, names not '
                         f'known: {names}')
        for name, entry in t['aliased'].items():
            parts.append(f"{entry['count']} {name!r} read as "
                         f"{entry['target']!r} (class_aliases)")
        if t['malformed']:
            parts.append(f"{len(t['malformed'])} malformed files left out")
        lines.append(f"annotations ({t['owner']}): " + '; '.join(parts))
    return lines


def add_findings(report: dict, findings: Sequence[dict]) -> dict:
    """Add dataset-level findings to a report (e.g. a build failure's)."""
    for found in findings:
        report['issues'].insert(0, dict(found))
        entry = report['summary'].setdefault(found['kind'], dict(
            severity=found['severity'], findings=0,
            meaning=CHECKS[found['kind']][1]))
        entry['findings'] += 1
        report['errors' if found['severity'] == ERROR else 'warnings'] += 1
    return report
