import pytest
from mmengine.registry import DefaultScope


@pytest.fixture(autouse=True)
def mmsafe_scope():
    """Build models as mmsafe's configs do (``default_scope='mmsafe'``):
    nested components (e.g. the data preprocessor) resolve in mmsafe's
    registries, then MMDetection's."""
    name = f'tests_models_{id(object())}'
    with DefaultScope.overwrite_default_scope('mmsafe'):
        if DefaultScope.get_current_instance() is None:
            DefaultScope.get_instance(name, scope_name='mmsafe')
        yield
