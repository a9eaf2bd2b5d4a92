"""AmpNaNSkipOptimWrapper accepts every configuration of MMEngine's
AmpOptimWrapper and, on healthy steps, updates the weights exactly as
autocast + GradScaler do (on CPU ``ReferenceCpuAmpOptimWrapper``:
AmpOptimWrapper's step; on CUDA, where a GPU is present, MMEngine's own
AmpOptimWrapper), including after a NaN step was skipped."""
import pytest
import torch
from mmengine.dataset import pseudo_collate
from mmengine.logging import MessageHub
from mmengine.optim import AmpOptimWrapper

from mmsafe.compat import cpu_autocast_dtypes
from mmsafe.engine.optimizers import AmpNaNSkipOptimWrapper
from tests.engine.identity_toys import ReferenceCpuAmpOptimWrapper
from tests.engine.step_toys import StepToyDataset, StepToyDetector
from tests.utils import cpu_and_cuda, skip_without_autocast

NAN_BATCH = 2
BATCHES = [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]
LOSS_SCALES = {
    'dynamic': 'dynamic',
    'static': 512.0,
    'dict': dict(init_scale=256.0, growth_interval=2, backoff_factor=0.25),
    'disabled': dict(enabled=False),
}


@pytest.fixture(autouse=True)
def fresh_state():
    hub = MessageHub.get_instance('test_amp_matrix')
    hub.update_info('iter', 0)
    yield hub


def train(wrapper_cls, batches, dtype, loss_scale, clip_grad, device='cpu'):
    data = StepToyDataset(faults=[(4, 'nan_loss')])
    torch.manual_seed(0)
    model = StepToyDetector().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                                weight_decay=0.01)
    kwargs = dict(device_type=device) if (
        wrapper_cls is AmpNaNSkipOptimWrapper) else {}
    wrapper = wrapper_cls(optimizer=optimizer, loss_scale=loss_scale,
                          dtype=dtype, clip_grad=clip_grad, **kwargs)
    hub = MessageHub.get_current_instance()
    for it, indices in enumerate(batches):
        hub.update_info('iter', it)
        model.train_step(pseudo_collate([data[i] for i in indices]), wrapper)
    return model, wrapper


#: What AmpNaNSkipOptimWrapper must equal on each device: MMEngine's own
#: AmpOptimWrapper on CUDA; its arithmetic on CPU, where it refuses to run.
REFERENCES = {'cpu': ReferenceCpuAmpOptimWrapper, 'cuda': AmpOptimWrapper}


@pytest.mark.parametrize('device', cpu_and_cuda())
@pytest.mark.parametrize('clip', [False, True])
@pytest.mark.parametrize('scale', sorted(LOSS_SCALES))
@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
def test_healthy_steps_match_the_amp_reference(dtype, scale, clip, device):
    skip_without_autocast(device, dtype)
    loss_scale = LOSS_SCALES[scale]
    clip_grad = dict(max_norm=1.0) if clip else None
    model, wrapper = train(AmpNaNSkipOptimWrapper, BATCHES, dtype,
                           loss_scale, clip_grad, device)
    enabled = scale != 'disabled'
    # With a scaler, GradScaler itself skips the NaN step (and backs the
    # scale off); without one, the reference must not see that batch.
    reference_batches = BATCHES if enabled else [
        b for i, b in enumerate(BATCHES) if i != NAN_BATCH]
    ref_model, ref_wrapper = train(REFERENCES[device], reference_batches,
                                   dtype, loss_scale, clip_grad, device)
    assert wrapper.counters['skipped'] == 1
    assert wrapper.counters['nan_skips'] == 1
    assert wrapper.counters['steps'] == len(BATCHES) - 1
    for (name, p), ref in zip(model.named_parameters(),
                              ref_model.parameters()):
        assert torch.isfinite(p).all(), name
        assert torch.equal(p, ref), name
    for p, ref in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(wrapper.optimizer.state[p]['momentum_buffer'],
                           ref_wrapper.optimizer.state[ref]['momentum_buffer'])
    assert wrapper.loss_scaler.is_enabled() == enabled
    if enabled:
        assert (wrapper.loss_scaler.state_dict() ==
                ref_wrapper.loss_scaler.state_dict())


def test_cpu_float16_refused_where_torch_lacks_it():
    """A torch whose CPU autocast has bfloat16 only (2.1, 2.2) gets a clear
    error when the wrapper is built, not a RuntimeError from inside
    torch.autocast at the first iteration."""
    model = StepToyDetector()
    kwargs = dict(dtype='float16', device_type='cpu',
                  optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    if torch.float16 in cpu_autocast_dtypes():
        assert AmpNaNSkipOptimWrapper(**kwargs).cast_dtype == torch.float16
        return
    with pytest.raises(ValueError) as info:
        AmpNaNSkipOptimWrapper(**kwargs)
    message = str(info.value)
    assert "supports ['bfloat16'] only, not float16" in message, message
    assert "optim_wrapper.dtype='bfloat16'" in message


def test_every_amp_optim_wrapper_option_builds():
    from mmdet.registry import OPTIM_WRAPPERS
    model = StepToyDetector()
    dtypes = [None, 'bfloat16', torch.bfloat16]
    if torch.float16 in cpu_autocast_dtypes():
        dtypes.append('float16')
    for dtype in dtypes:
        for loss_scale in ('dynamic', 512.0, 64, dict(init_scale=8.0),
                           dict(enabled=False)):
            wrapper = OPTIM_WRAPPERS.build(dict(
                type='AmpNaNSkipOptimWrapper', dtype=dtype,
                loss_scale=loss_scale,
                optimizer=torch.optim.SGD(model.parameters(), lr=0.1)))
            assert isinstance(wrapper, AmpNaNSkipOptimWrapper)
    with pytest.raises(TypeError, match='unknown GradScaler arguments'):
        AmpNaNSkipOptimWrapper(
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
            loss_scale=dict(init_scal=8.0))
