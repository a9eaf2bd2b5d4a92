"""mmsafe.compat answers alike on every supported torch, and its CPU
GradScaler does what torch's own does."""
import warnings

import numpy as np
import pytest
import torch

from mmsafe import compat
from mmsafe.compat.cpu_grad_scaler import CpuGradScaler


def test_autocast_queries_follow_the_context():
    assert not compat.autocast_enabled('cpu')
    with torch.autocast('cpu', dtype=torch.bfloat16):
        assert compat.autocast_enabled('cpu')
        assert not compat.autocast_enabled('cuda')
        assert compat.autocast_dtype('cpu') == torch.bfloat16
        with torch.autocast('cpu', enabled=False):
            assert not compat.autocast_enabled('cpu')
    assert not compat.autocast_enabled('cpu')


def test_cpu_autocast_dtypes_are_the_ones_that_work():
    usable = compat.cpu_autocast_dtypes()
    assert torch.bfloat16 in usable
    x = torch.ones(4, 4)
    for dtype in (torch.bfloat16, torch.float16):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            try:
                with torch.autocast('cpu', dtype=dtype):
                    works = (x @ x).dtype == dtype
            except RuntimeError:
                works = False
        assert works == (dtype in usable), dtype


@pytest.mark.parametrize('dtype', [np.uint8, np.int16, np.uint16, np.float32,
                                   np.float64])
def test_numpy_to_tensor_keeps_every_value(dtype):
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else None
    values = ([info.min, 1, info.max] if info else [-1.5, 0.0, 3e38])
    array = np.array(values, dtype=dtype)
    tensor = compat.numpy_to_tensor(array)
    assert tensor.tolist() == array.tolist()
    if compat.supports_tensor_dtype(dtype):
        # shared memory, same dtype, as torch.from_numpy
        assert tensor.numpy().dtype == np.dtype(dtype)
        array[0] = array[1]
        assert tensor[0] == tensor[1]
    else:
        assert dtype == np.uint16 and tensor.dtype == torch.int32


def _train_with(scaler, steps=7, inf_at=(2, 5)):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    history = []
    for step in range(steps):
        loss = model(torch.randn(4, 3)).square().mean()
        if step in inf_at:
            loss = loss * float('inf')
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        history.append((scaler.get_scale(), scaler._get_growth_tracker()))
    return history, [p.detach().clone() for p in model.parameters()]


def test_cpu_grad_scaler_arithmetic():
    history, _ = _train_with(CpuGradScaler(init_scale=8.0, growth_interval=2))
    # grow every 2 clean steps, halve on inf (steps 2 and 5), reset tracker
    assert history == [(8.0, 1), (16.0, 0), (8.0, 0), (8.0, 1), (16.0, 0),
                       (8.0, 0), (8.0, 1)]


def test_cpu_grad_scaler_matches_torch_where_torch_has_one():
    native = getattr(torch.amp, 'GradScaler', None)
    try:
        reference = native('cpu', init_scale=8.0, growth_interval=2)
        reference.scale(torch.ones(()))
    except (TypeError, RuntimeError, NotImplementedError) as err:
        pytest.skip(f'this torch has no CPU GradScaler ({err}); '
                    'test_cpu_grad_scaler_arithmetic covers it')
    ours, ours_weights = _train_with(CpuGradScaler(init_scale=8.0,
                                                   growth_interval=2))
    theirs, their_weights = _train_with(native('cpu', init_scale=8.0,
                                               growth_interval=2))
    assert ours == theirs
    assert all(torch.equal(a, b) for a, b in zip(ours_weights,
                                                 their_weights))
    assert CpuGradScaler(init_scale=8.0).state_dict().keys() == \
        native('cpu', init_scale=8.0).state_dict().keys()


def test_grad_scaler_is_torchs_own_where_it_exists():
    scaler = compat.grad_scaler('cpu', init_scale=4.0)
    scaler.scale(torch.ones(()))
    assert scaler.get_scale() == 4.0
    if getattr(torch.amp, 'GradScaler', None) is not None:
        assert type(scaler) is torch.amp.GradScaler
    else:
        assert type(scaler) is CpuGradScaler
    disabled = compat.grad_scaler('cpu', enabled=False)
    assert not disabled.is_enabled()
    loss = torch.ones(())
    assert disabled.scale(loss) is loss


def test_checkpoint_dtypes_and_storage_classes():
    """The dtypes and storage classes that checkpoints name, as this torch
    has them: ordinary tensor dtypes only behind storage classes."""
    dtypes = compat.tensor_dtypes()
    assert dtypes['torch.float32'] is torch.float32
    assert dtypes['torch.float'] is torch.float32
    plain = compat.plain_tensor_dtypes()
    assert torch.bfloat16 in plain and torch.qint8 not in plain
    storages = compat.storage_dtypes()
    assert storages['torch.FloatStorage'] is torch.float32
    assert storages['torch.BFloat16Storage'] is torch.bfloat16
    assert storages['torch.UntypedStorage'] is torch.uint8
    assert 'torch.QInt8Storage' not in storages
    assert set(storages.values()) <= plain
    functions = compat.numpy_pickle_functions()
    for package in ('numpy.core', 'numpy._core'):
        reconstruct = functions[f'{package}.multiarray._reconstruct']
        assert reconstruct(np.ndarray, (0, ), b'b').shape == (0, )
        scalar = functions[f'{package}.multiarray.scalar']
        assert scalar(np.dtype('f8'), b'\0' * 8) == 0.0
        frombuffer = functions[f'{package}.numeric._frombuffer']
        assert frombuffer(b'\0' * 8, np.dtype('f4'), (2, ), 'C').shape == \
            (2, )
