import math
import statistics

import pytest
import torch
from mmengine.logging import MessageHub

from mmdet.registry import MODELS

import mmsafe  # noqa: F401


def _head(**kwargs):
    cfg = dict(type='MACLHead', in_dim=16, proj_dim=8, feature_level=-1,
               loss_weight=1.0)
    cfg.update(kwargs)
    torch.manual_seed(0)
    return MODELS.build(cfg)


def _feats(batch, channels=16, seed=1):
    g = torch.Generator().manual_seed(seed)
    vis = (torch.randn(batch, 8, 6, 6, generator=g),
           torch.randn(batch, channels, 3, 3, generator=g))
    ir = (torch.randn(batch, 8, 6, 6, generator=g),
          torch.randn(batch, channels, 3, 3, generator=g))
    return vis, ir


def _grads(head):
    return {n: p.grad.clone() for n, p in head.named_parameters()}


def test_loss_is_symmetric_infonce_with_chance_level_ln_b():
    head = _head(init_temperature=1.0, max_temperature=1.0)
    vis, ir = _feats(6)
    loss = head.loss(vis, ir)['loss_macl']
    assert head.last_num_pairs == 6
    # Same embeddings in both modalities, unit temperature: the positive is
    # the most similar candidate, so the loss is below chance level.
    with torch.no_grad():
        head.ir_projector.load_state_dict(head.vis_projector.state_dict())
    aligned = head.loss(vis, vis)['loss_macl']
    assert aligned < math.log(6)
    # Independent random embeddings at unit temperature: at chance level
    # ln(B), within 4 spreads of that loss over 16 seeds.
    fresh = _head(init_temperature=1.0, max_temperature=1.0)
    chance = [fresh.loss(*_feats(6, seed=s))['loss_macl'].item()
              for s in range(1, 17)]
    assert abs(loss.item() - math.log(6)) < 4 * statistics.stdev(chance)
    # Symmetric: swapping modalities (and projectors) gives the same value.
    with torch.no_grad():
        head2 = _head(init_temperature=1.0, max_temperature=1.0,
                      shared_projector=True)
        head2.eval()  # frozen feature centres: both calls see the same
        a = head2.loss(vis, ir)['loss_macl']
        b = head2.loss(ir, vis)['loss_macl']
    torch.testing.assert_close(a, b)


def test_loss_weight_really_applies_to_loss_and_gradient():
    vis, ir = _feats(4)
    head1 = _head(loss_weight=0.3)
    loss1 = head1.loss(vis, ir)['loss_macl']
    loss1.backward()
    grads1 = _grads(head1)
    head2 = _head(loss_weight=0.6)
    loss2 = head2.loss(vis, ir)['loss_macl']
    loss2.backward()
    grads2 = _grads(head2)
    torch.testing.assert_close(loss2, 2 * loss1)
    assert loss1.item() > 0
    assert set(grads1) == set(grads2)
    for name in grads1:
        assert grads1[name].abs().sum() > 0, name
        torch.testing.assert_close(grads2[name], 2 * grads1[name])


def test_single_pair_returns_connected_zero_and_counts():
    hub = MessageHub.get_instance('test_macl_single_pair')
    head = _head()
    vis, ir = _feats(1)
    vis = tuple(v.requires_grad_() for v in vis)
    losses = head.loss(vis, ir)
    assert 'loss_macl' in losses
    loss = losses['loss_macl']
    assert loss.item() == 0.0
    loss.backward()
    # Every parameter of the head gets a gradient (DDP needs one for each).
    for name, p in head.named_parameters():
        assert p.grad is not None, name
    assert vis[-1].grad is not None
    assert head.last_num_pairs == 1
    assert head.num_small_batches == 1
    info = MessageHub.get_current_instance().get_info('mmsafe/macl')
    assert info['small_batches'] == 1 and info['last_num_pairs'] == 1
    head.loss(*_feats(1))
    info = MessageHub.get_current_instance().get_info('mmsafe/macl')
    assert info['small_batches'] == 2 and info['calls'] == 2
    head.loss(*_feats(3))
    info = MessageHub.get_current_instance().get_info('mmsafe/macl')
    assert info['small_batches'] == 2 and info['last_num_pairs'] == 3
    del hub


def test_batch_of_one_through_projector_has_no_batchnorm():
    head = _head()
    head.train()
    assert not any(
        isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
        for m in head.modules())
    with pytest.raises(ValueError, match='BatchNorm'):
        _head(norm='BN')


def test_in_dim_mismatch_names_both_numbers():
    head = _head(in_dim=1024)
    vis, ir = _feats(4, channels=256)
    with pytest.raises(ValueError) as err:
        head.loss(vis, ir)
    msg = str(err.value)
    assert 'in_dim=1024' in msg and '256 channels' in msg
    assert 'macl_head.in_dim=256' in msg
    with pytest.raises(IndexError, match='feature_level=5'):
        _head(feature_level=5).loss(*_feats(4))


def test_temperature_is_learnable_log_parametrised_and_clamped():
    head = _head(init_temperature=0.07, min_temperature=0.05,
                 max_temperature=0.5)
    assert isinstance(head.log_temperature, torch.nn.Parameter)
    torch.testing.assert_close(head.temperature, torch.tensor(0.07))
    with torch.no_grad():
        head.log_temperature.fill_(math.log(1e-4))
    assert head.temperature.item() == pytest.approx(0.05)
    with torch.no_grad():
        head.log_temperature.fill_(math.log(10.))
    assert head.temperature.item() == pytest.approx(0.5)
    fixed = _head(learnable_temperature=False)
    assert 'log_temperature' not in dict(fixed.named_parameters())


def _train_on_shared_content(seed, batch=8, iters=150, untrained=20):
    """Losses of the head alone on pairs that share a latent (seen through
    different linear maps plus noise per modality): ``untrained`` batches
    before any step, then ``iters`` training iterations."""
    torch.manual_seed(seed)
    head = _head(in_dim=16, feature_level=0)
    torch.manual_seed(seed)
    opt = torch.optim.Adam(head.parameters(), lr=1e-2)
    mix_v, mix_r = torch.randn(6, 16), torch.randn(6, 16)

    def pairs():
        z = torch.randn(batch, 6)
        vis = (z @ mix_v + 0.3 * torch.randn(batch, 16))[..., None, None]
        ir = (z @ mix_r + 0.3 * torch.randn(batch, 16))[..., None, None]
        return (vis.expand(-1, -1, 2, 2), ), (ir.expand(-1, -1, 2, 2), )

    with torch.no_grad():
        before = [head.loss(*pairs())['loss_macl'].item()
                  for _ in range(untrained)]
    losses = []
    for _ in range(iters):
        loss = head.loss(*pairs())['loss_macl']
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert head.last_num_pairs == batch
    return before, losses


def test_loss_falls_below_chance_when_pairs_share_content():
    """Training the head alone must bring the loss well below chance level
    ln(B); broken labels, gradients or normalisation would not. The margin
    is the spread of the untrained head's loss over seeds and batches (for
    a mean of 10 batches), not one seed's value."""
    batch, seeds = 8, (0, 1, 2)
    runs = [_train_on_shared_content(seed, batch) for seed in seeds]
    untrained = [loss for before, _ in runs for loss in before]
    margin = 4 * statistics.stdev(untrained) / math.sqrt(10)
    for seed, (before, losses) in zip(seeds, runs):
        end = statistics.mean(losses[-10:])
        # Below chance, and below where this seed started, by the margin.
        assert end < math.log(batch) - margin, (seed, end, margin)
        assert end < statistics.mean(before) - margin, (seed, end, margin)
