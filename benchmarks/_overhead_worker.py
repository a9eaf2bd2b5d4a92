"""One training process of ``guard_overhead.py``: the demo config with every
mmsafe guard on (``--mode on``) or off (``--mode off``), trained by
:class:`benchmarks.gated_loop.GatedIterLoop` in coordinator-started blocks.
Started by the coordinator, directly or through ``torch.distributed.run``
(``--launcher pytorch``); not meant to be run by hand."""
import argparse
import os.path as osp
import sys

REPO_ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)

from mmengine.config import Config  # noqa: E402
from mmengine.registry import RUNNERS  # noqa: E402

from benchmarks._common import DEMO_CONFIG, SAFETY_RUNTIME  # noqa: E402
# registers GatedIterLoop (the worker builds the runner itself)
import benchmarks.gated_loop  # noqa: E402,F401

#: Guards that the safety fragment does not list, with the LLVIP recipe's
#: settings. Warnings only.
EXTRA_GUARDS = [
    dict(type='ScalarBandsHook', bands=[
        dict(key='loss', finite=True),
        dict(key='loss_macl', max=1.0, after_iter=50),
        dict(key='grad_norm', max=20.0),
    ]),
    dict(type='ValidInstanceResampleHook'),
]

_PLAIN_WRAPPER = {
    'NaNSkipOptimWrapper': 'OptimWrapper',
    'AmpNaNSkipOptimWrapper': 'AmpOptimWrapper',
}
_NAN_SKIP_ONLY_KEYS = ('clip_grad_per_module', 'max_consecutive_skips',
                       'log_all_ranks')


def _is_mmsafe_hook(hook: dict) -> bool:
    from mmdet.registry import HOOKS
    hook_type = hook.get('type')
    cls = hook_type if isinstance(hook_type, type) else HOOKS.get(hook_type)
    return cls is not None and cls.__module__.startswith('mmsafe.')


def build_config(args) -> Config:
    cfg = Config.fromfile(DEMO_CONFIG)
    import mmsafe  # noqa: F401  (registers the hooks looked up below)
    own_hooks = [h for h in cfg.get('custom_hooks', []) or []
                 if not _is_mmsafe_hook(h)]
    wrapper = dict(cfg.optim_wrapper)
    wrapper_type = _PLAIN_WRAPPER.get(wrapper.get('type'),
                                      wrapper.get('type', 'OptimWrapper'))
    for key in _NAN_SKIP_ONLY_KEYS:
        wrapper.pop(key, None)
    if args.amp:
        wrapper_type = 'AmpOptimWrapper'
    if args.mode == 'on':
        safety = Config.fromfile(SAFETY_RUNTIME)
        guards = list(safety.custom_hooks) + EXTRA_GUARDS
        # the demo's own mmsafe hooks (if any) keep their settings
        demo_guards = [h for h in cfg.get('custom_hooks', []) or []
                       if _is_mmsafe_hook(h)]
        guards = demo_guards + [g for g in guards
                                if g['type'] not in {h['type']
                                                     for h in demo_guards}]
        cfg.custom_hooks = own_hooks + guards
        wrapper['type'] = ('AmpNaNSkipOptimWrapper'
                           if wrapper_type == 'AmpOptimWrapper' else
                           'NaNSkipOptimWrapper')
    else:
        cfg.custom_hooks = own_hooks
        wrapper['type'] = wrapper_type
    cfg.optim_wrapper = wrapper
    cfg.train_cfg = dict(
        type='GatedIterLoop', gate_dir=args.gate_dir, mode=args.mode,
        block_iters=args.block_iters, num_blocks=args.blocks,
        count_block=True, profile_block=args.profile)
    # a constant-length warmup only: the schedule must not depend on epochs
    cfg.param_scheduler = [
        dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0,
             end=20)
    ]
    cfg.log_processor = dict(type='LogProcessor', window_size=10,
                             by_epoch=False)
    cfg.default_hooks.checkpoint = dict(
        type='CheckpointHook', interval=10**9, by_epoch=False,
        save_last=False)
    cfg.work_dir = osp.join(args.work_dir, args.mode)
    cfg.experiment_name = f'bench_{args.mode}'
    cfg.launcher = args.launcher
    # on: mmsafe's runner, as the safety fragment sets it. off: MMEngine's
    # plain Runner, except for DDP on CPU, which only SafeRunner starts.
    cpu_ddp = cfg.launcher != 'none' and args.device == 'cpu'
    cfg.runner_type = ('SafeRunner' if args.mode == 'on' or cpu_ddp else
                       'Runner')
    if cfg.launcher != 'none':
        # on CPU (gloo) SafeRunner switches the demo's nccl; say gloo here
        if args.device == 'cpu':
            cfg.env_cfg.dist_cfg = dict(backend='gloo')
    return cfg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--mode', choices=['on', 'off'], required=True)
    parser.add_argument('--gate-dir', required=True)
    parser.add_argument('--work-dir', required=True)
    parser.add_argument('--block-iters', type=int, required=True)
    parser.add_argument('--blocks', type=int, required=True)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--amp', action='store_true')
    parser.add_argument('--profile', action='store_true')
    parser.add_argument('--launcher', default='none')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    args = parser.parse_args()
    runner = RUNNERS.build(build_config(args))
    runner.train()


if __name__ == '__main__':
    main()
