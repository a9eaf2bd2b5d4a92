"""Shared policy for samples whose partner image (the other modality) is
missing: an error that names the files by default, or a counted, logged
skip when the config opts in with ``on_missing_pair='skip'``.

Never a silent single-modality sample: a public fork once returned
visible-only data when the infrared partner was missing, and its MACL loss
learnt nothing for days.
"""
import logging
from typing import List, Sequence, Tuple

from mmsafe.errors import MMSafeFileNotFoundError, MMSafeValueError
from mmsafe.events import log, update_counters
from mmsafe.guard_outputs import CounterKey, GuardOutputs, Section

guard_outputs = GuardOutputs(Section.OTHER, counters=(CounterKey.PAIRING, ))

MISSING_PAIR_POLICIES = ('error', 'skip')
#: how many missing files an error or log line names
NUM_NAMED = 5

# (visible path, infrared path, what is missing)
MissingPair = Tuple[str, str, str]


def check_missing_pair_policy(policy: str) -> str:
    """Validate ``on_missing_pair``; returns it."""
    if policy not in MISSING_PAIR_POLICIES:
        raise MMSafeValueError(f'on_missing_pair must be one of '
                               f'{MISSING_PAIR_POLICIES}, got {policy!r}')
    return policy


def missing_side(has_visible: bool, has_infrared: bool) -> str:
    """Which image of a broken pair is missing, for error messages."""
    if not (has_visible or has_infrared):
        return 'both images missing'
    return 'visible missing' if not has_visible else 'infrared missing'


def describe_missing(missing: Sequence[MissingPair],
                     limit: int = NUM_NAMED) -> str:
    """One line per missing pair, for the first ``limit`` pairs."""
    lines = [
        f'  {what}: visible={vis} | infrared={ir}'
        for vis, ir, what in list(missing)[:limit]
    ]
    if len(missing) > limit:
        lines.append(f'  ... and {len(missing) - limit} more')
    return '\n'.join(lines)


def raise_missing_annotations(owner: str, paths: Sequence[str], total: int,
                              what: str) -> None:
    """Raise ``FileNotFoundError`` naming the first annotation files that
    are missing (nothing when ``paths`` is empty).

    Args:
        owner (str): who checks, for the message.
        paths (list[str]): the missing annotation files.
        total (int): number of samples checked.
        what (str): what lacks them, e.g. ``'images have no annotation xml
            in Annotations/'``.
    """
    if not paths:
        return
    listing = '\n'.join(f'  {p}' for p in list(paths)[:NUM_NAMED])
    raise MMSafeFileNotFoundError(f'{owner}: {len(paths)} of {total} {what}. '
                                  f'First:\n{listing}')


def handle_missing_pairs(owner: str, missing: List[MissingPair], total: int,
                         policy: str) -> None:
    """Raise or log for samples without a partner image.

    Args:
        owner (str): who checks (class name and data root), for the message.
        missing (list[tuple]): ``(visible path, infrared path, what)`` for
            every sample whose partner cannot be found.
        total (int): number of samples checked.
        policy (str): ``'error'`` raises ``FileNotFoundError``; ``'skip'``
            logs the count (the caller drops the samples). All samples
            missing is an error under both policies.
    """
    if not missing:
        return
    count = len(missing)
    listing = describe_missing(missing)
    if policy == 'error' or count == total:
        hint = ('Fix the data (every visible image needs its infrared '
                'partner with the same file name), or set '
                "on_missing_pair='skip' to drop such samples (logged).")
        if count == total:
            hint = ('No sample has a partner: check data_root / data_prefix '
                    '(img, ir_img) or the partner rule.')
        raise MMSafeFileNotFoundError(
            f'{owner}: {count} of {total} samples have no complete '
            f'visible+infrared pair. First missing:\n{listing}\n{hint}')
    log(f'{owner}: dropped {count} of {total} samples whose visible/infrared '
        f"partner is missing (on_missing_pair='skip'). First:\n{listing}",
        logging.WARNING)
    update_counters(CounterKey.PAIRING, missing_pairs_skipped=count)
