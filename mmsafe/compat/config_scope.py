"""``mmsafe::`` config paths: MMEngine 0.10's table of config scopes.

MMEngine resolves ``_base_ = ['pkg::path/to/config.py']`` to
``<installed pkg>/.mim/configs/path/to/config.py``, but only for the
packages named in ``mmengine.config.utils.MODULE2PACKAGE`` (OpenMMLab's
own: ``mmdet``, ``mmyolo``, ...), and it has no registration call for
another package. :func:`register_config_scope` adds ``mmsafe`` to that
table, once, before a config is read. mmsafe's tools call it
(``mmsafe.tools.*``, ``tools/*.py``, ``mim train mmsafe``); importing
mmsafe does not. Targets MMEngine 0.10.x;
``tests/compat/test_config_scope.py`` fails when MMEngine moves the table
or resolves ``mmsafe::`` by itself.
"""

SCOPE = 'mmsafe'


def register_config_scope() -> None:
    """Let MMEngine's config loader resolve ``mmsafe::`` paths (idempotent;
    the entry maps the scope to the distribution of the same name)."""
    from mmengine.config import utils
    utils.MODULE2PACKAGE.setdefault(SCOPE, SCOPE)

