import pytest
from mmengine.registry import init_default_scope


@pytest.fixture(autouse=True)
def mmsafe_scope():
    """Build datasets and transforms as mmsafe's configs do
    (``default_scope='mmsafe'``: mmsafe's names, then MMDetection's;
    MMEngine's Runner sets the scope the same way)."""
    init_default_scope('mmsafe')
    yield
