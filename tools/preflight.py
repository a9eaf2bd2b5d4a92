"""Check a training config in seconds, before a run: ``mmsafe.tools.preflight``.

The same command as ``mmsafe-preflight`` and ``python -m mmsafe.tools.preflight`` of
an installed mmsafe (``python tools/preflight.py --help`` lists the options).
Run from a clone, this file puts the clone's mmsafe first on the path; in
an installed package (``mmsafe/.mim/tools/``, where ``mim`` looks) it
uses the installed one.
"""
import os.path as osp
import sys

_CLONE = osp.dirname(osp.dirname(osp.abspath(__file__)))
if osp.isfile(osp.join(_CLONE, 'mmsafe', '__init__.py')):
    sys.path.insert(0, _CLONE)

from mmsafe.tools.preflight import console_main  # noqa: E402

if __name__ == '__main__':
    sys.exit(console_main())
