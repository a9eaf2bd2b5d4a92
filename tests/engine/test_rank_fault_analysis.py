"""The pieces behind RankFaultHook: DDP's messages parsed, its parameter
indices named (checked against DDP's own reducer), loss-term changes and
the modules a loss no longer reaches; and a vanished loss term in a single
process run."""
import os.path as osp
import tempfile

import pytest
import torch
import torch.nn as nn

from mmsafe.engine.hooks.rank_fault_hook import (LossTermWatch,
                                                 ddp_error_kind,
                                                 group_by_module,
                                                 names_for_indices,
                                                 parameter_indices,
                                                 reached_parameters,
                                                 reducer_parameter_names)
from tests.engine.check_toys_cfg import toy_config
from tests.engine.check_toys_run import events, why
from tests.utils import run_train

UNUSED = (
    'Expected to have finished reduction in the prior iteration before '
    'starting a new one. This error indicates that your module has '
    'parameters that were not used in producing loss. ...\n'
    'Parameter indices which did not receive grad for rank 1: 6 7 8 18\n'
    ' In addition, you can set the environment variable '
    'TORCH_DISTRIBUTED_DEBUG to either INFO or DETAIL ...')
TWICE = (
    'Expected to mark a variable ready only once. This error is caused by '
    'one of the following reasons: ... Parameter at index 3 with name '
    'x.weight has been marked as ready twice.')


def test_ddp_messages_are_recognised_and_parsed():
    assert ddp_error_kind(RuntimeError(UNUSED)) == 'unused'
    assert parameter_indices(UNUSED) == [6, 7, 8, 18]
    assert ddp_error_kind(RuntimeError(TWICE)) == 'twice'
    assert parameter_indices(TWICE) == [3]
    assert ddp_error_kind(RuntimeError('CUDA out of memory')) is None
    assert ddp_error_kind(ValueError(UNUSED)) is None


class _Net(nn.Module):

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))  # the root's own
        self.a = nn.Linear(2, 2)
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)
        self.b = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 2))
        self.tied = nn.Linear(2, 2)
        self.tied.weight = self.a.weight  # shared: counted once
        self.ignored = nn.Linear(2, 2)

    def forward(self, x):
        return self.b(self.a(x) * self.scale) + self.tied(x)


def test_index_names_follow_ddps_reducer(tmp_path):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group(
        'gloo', init_method=f'file://{tmp_path}/store', rank=0,
        world_size=1)
    try:
        net = _Net()
        DDP._set_params_and_buffers_to_ignore_for_model(
            net, ['ignored.weight', 'ignored.bias'])
        ddp = DDP(net)
        # DDP's own list of the parameters it reduces, in its order.
        params, _ = ddp._build_params_for_reducer()
        by_id = {id(p): n for n, p in net.named_parameters()}
        expected = [by_id[id(p)] for p in params]
        assert reducer_parameter_names(
            net, ddp.parameters_to_ignore) == expected
        assert names_for_indices(ddp, [0, 2, len(expected) - 1]) == [
            expected[0], expected[2], expected[-1]]
        assert 'frozen.weight' not in expected
        assert 'ignored.weight' not in expected
    finally:
        dist.destroy_process_group()


def _losses(net, x, drop=(), detach=()):
    out = net(x)
    losses = dict(loss_a=net.a(x).sum(), loss_b=out.sum(), acc=torch.ones(1))
    for key in drop:
        losses.pop(key)
    for key in detach:
        losses[key] = losses[key].detach()
    return losses


def test_loss_term_watch_reports_changes_and_unreached_modules():
    net = _Net()
    params = {id(p): n for n, p in net.named_parameters() if p.requires_grad}
    watch = LossTermWatch()
    x = torch.ones(1, 2)
    assert watch.observe(1, _losses(net, x), params) is None
    assert watch.observe(2, _losses(net, x), params) is None
    change = watch.observe(3, _losses(net, x, drop=['loss_b']), params)
    assert change['missing'] == ['loss_b'] and not change['restored']
    # loss_a still reaches a (and so the weight tied to it); b, the root's
    # scale and tied's own bias not; 'ignored' was never reached
    assert change['unreached'] == ['b.0.bias', 'b.0.weight', 'b.2.bias',
                                   'b.2.weight', 'scale', 'tied.bias']
    assert group_by_module(change['unreached'], net) == [
        'b (4 parameters)', 'tied (1 parameter)', 'scale']
    # the same fault again: no new report; back to normal: reported
    assert watch.observe(4, _losses(net, x, drop=['loss_b']), params) is None
    assert watch.observe(5, _losses(net, x), params)['restored']
    # a term that stops carrying a gradient
    change = watch.observe(6, _losses(net, x, detach=['loss_a']), params)
    assert change['detached'] == ['loss_a'] and not change['missing']
    assert watch.changes[-1] is change


def test_reached_parameters_and_module_grouping():
    net = _Net()
    x = torch.ones(1, 2)
    reached = reached_parameters(dict(loss=net.b(x).sum()))
    names = {n for n, p in net.named_parameters() if id(p) in reached}
    assert names == {'b.0.weight', 'b.0.bias', 'b.2.weight', 'b.2.bias'}
    assert group_by_module(sorted(names), net) == ['b (4 parameters)']
    assert group_by_module(['b.0.weight'], net) == ['b.0.weight']


@pytest.mark.timeout(400)
def test_vanished_loss_term_in_a_single_process():
    tmp = tempfile.mkdtemp()
    hooks = "[dict(type='RankFaultHook', policy='raise')]"
    cfg = toy_config(tmp, 'single', hooks, max_iters=20,
                     model="macl_fault='vanish', macl_fault_at=12",
                     extra="runner_type = 'SafeRunner'\n")
    result = run_train(cfg, timeout=300)
    assert not result.timed_out and result.returncode != 0, why(result)
    assert ('[mmsafe] rank 0, iteration 13: loss term loss_macl missing '
            "from the loss dict (present in this rank's iterations 1-12). "
            'The loss no longer reaches: macl_head (13 parameters).'
            in result.output), why(result)
    assert "Set RankFaultHook policy='warn' to only report this." in \
        result.output
    found = events(osp.join(tmp, 'single'), 'rank_fault_loss_terms')
    assert [(e['rank'], e['iter'], e['missing']) for e in found] == [
        (0, 13, ['loss_macl'])]


def test_communication_errors_are_told_from_a_ranks_own_error():
    """A collective that failed because a peer is gone is a consequence;
    mmsafe's own errors name this rank's fault, even when their message
    holds words such as 'timeout' (a download's timeout)."""
    from mmsafe.checkpoint.remote_weights import WeightsUnavailableError
    from mmsafe.engine.runner.errors import is_communication_error
    assert is_communication_error(RuntimeError(
        '[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection '
        'closed by peer [127.0.0.1]:29500'))
    assert is_communication_error(ConnectionResetError('reset by peer'))
    assert not is_communication_error(ValueError('a bad config value'))
    assert not is_communication_error(WeightsUnavailableError(
        '[mmsafe] pretrained weights https://x/r50.pth are not available: '
        'the download failed on rank 0: URLError: timed out (timeout 15 s, '
        'MMSAFE_DOWNLOAD_TIMEOUT)'))
    # told by type, not by the module that defines it: any MMSafeError
    from mmsafe.errors import MMSafeError, MMSafeRuntimeError
    assert not is_communication_error(MMSafeRuntimeError(
        'the store timed out (timeout 30 s)'))

    class PluginError(MMSafeError, RuntimeError):
        pass
    assert not is_communication_error(PluginError('gloo socket timeout'))
    assert is_communication_error(RuntimeError('gloo socket timeout'))
