"""mmsafe's configs in MMEngine's pure-Python style.

A pure-Python config (MMEngine >= 0.8) reads them by module path::

    from mmengine.config import read_base

    with read_base():
        from mmsafe.configs._base_.safety_runtime import *  # noqa

Each has a text twin under the clone's ``configs/`` (the ``_base_ = [...]``
style, ``mmsafe::`` paths); a test keeps both the same. Type names are the
classes themselves, so they build whatever the config's default scope is.
"""
