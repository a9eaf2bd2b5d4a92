"""Score KAIST detection files as the KAIST devkit scores them: ``mmsafe.tools.eval_kaist``.

The same command as ``mmsafe-eval-kaist`` and ``python -m mmsafe.tools.eval_kaist`` of
an installed mmsafe (``python tools/eval_kaist.py --help`` lists the options).
Run from a clone, this file puts the clone's mmsafe first on the path; in
an installed package (``mmsafe/.mim/tools/``, where ``mim`` looks) it
uses the installed one.
"""
import os.path as osp
import sys

_CLONE = osp.dirname(osp.dirname(osp.abspath(__file__)))
if osp.isfile(osp.join(_CLONE, 'mmsafe', '__init__.py')):
    sys.path.insert(0, _CLONE)

from mmsafe.tools.eval_kaist import console_main  # noqa: E402

if __name__ == '__main__':
    sys.exit(console_main())
