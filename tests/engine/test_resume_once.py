"""A runner resumes once: ``load_or_resume`` runs at the start of each of
``train``/``val``/``test``, and a second call must not load the newest
checkpoint again over the weights the run has (MMEngine's own Runner loads
once per runner, too)."""
import os.path as osp

import torch

from tests.engine.ckpt_toys_cfg import TOY_CONFIG


def _runner(tmp_path, name, **extra):
    from mmengine.config import Config
    from mmengine.registry import RUNNERS

    import mmsafe  # noqa: F401  (registers SafeRunner)
    cfg = Config.fromstring(TOY_CONFIG.format(
        max_epochs=2, max_keep=-1, custom_hooks='[]'), '.py')
    cfg.work_dir = str(tmp_path / 'work')
    cfg.runner_type = 'SafeRunner'
    cfg.experiment_name = name
    cfg.merge_from_dict(extra)
    return RUNNERS.build(cfg)


def _params(runner):
    return {k: v.detach().clone()
            for k, v in runner.model.state_dict().items()}


def test_a_second_load_or_resume_keeps_the_run_s_weights(tmp_path):
    from mmsafe.events import read_events
    _runner(tmp_path, 'first').train()
    work_dir = str(tmp_path / 'work')
    assert osp.isfile(osp.join(work_dir, 'epoch_2.pth'))

    runner = _runner(tmp_path, 'resumed', resume=True)
    runner.load_or_resume()
    assert runner.train_loop.epoch == 2
    with torch.no_grad():
        for p in runner.model.parameters():
            p.add_(1.0)
    changed = _params(runner)
    runner.load_or_resume()  # what val()/test() after train() do
    after = _params(runner)
    assert all(torch.equal(changed[k], after[k]) for k in changed), \
        'the second load_or_resume loaded a checkpoint again'
    assert len(read_events(work_dir, 'resume')) == 1
