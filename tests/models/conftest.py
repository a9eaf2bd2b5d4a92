import pytest
from mmengine.registry import DefaultScope


@pytest.fixture(autouse=True)
def mmdet_scope():
    """Build models as configs with default_scope='mmdet' do: nested
    components (e.g. the data preprocessor) resolve in mmdet's registry."""
    name = f'tests_models_{id(object())}'
    with DefaultScope.overwrite_default_scope('mmdet'):
        if DefaultScope.get_current_instance() is None:
            DefaultScope.get_instance(name, scope_name='mmdet')
        yield
