import pytest
from mmengine.registry import init_default_scope


@pytest.fixture(autouse=True)
def mmdet_scope():
    """Build datasets and transforms as configs with default_scope='mmdet'
    do (MMEngine's Runner sets the scope the same way)."""
    init_default_scope('mmdet')
    yield
