"""What every preflight check can look at: the resolved config, the launcher
and a few things that are expensive enough to compute once (the registries
of the config's default scope, the built model)."""
import os
import platform
from typing import Any, Dict, Iterator, Optional, Tuple

DATALOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


class ModelInfo:
    """What the model check learned, for the checks that need the model.

    Args:
        model: the built ``nn.Module`` (on CPU, never run), or None.
        error (str): why it could not be built ('' when it was).
    """

    def __init__(self, model=None, error: str = ''):
        self.model = model
        self.error = error

    @property
    def num_params(self) -> int:
        if self.model is None:
            return 0
        return sum(p.numel() for p in self.model.parameters())

    @property
    def state_bytes(self) -> int:
        """Bytes of parameters and buffers as they would be saved."""
        if self.model is None:
            return 0
        tensors = list(self.model.parameters()) + list(self.model.buffers())
        return sum(t.numel() * t.element_size() for t in tensors)


class PreflightContext:
    """Shared state of one preflight run.

    Args:
        cfg (Config): the config, resolved as ``tools/train.py`` resolves it.
        launcher (str): ``'none'``, ``'pytorch'``, ``'slurm'`` or ``'mpi'``.
        samples (int): how many dataset items to open per dataset.
        system (str, optional): ``platform.system()`` to assume (tests).
        full_index (bool): build whole dataset indexes, as training does,
            instead of indexing the sampled images only.
    """

    def __init__(self, cfg, launcher: str = 'none', samples: int = 4,
                 system: Optional[str] = None, full_index: bool = False):
        self.cfg = cfg
        self.launcher = launcher or 'none'
        self.samples = max(1, int(samples))
        self.system = system or platform.system()
        self.full_index = full_index
        self.default_scope = cfg.get('default_scope', None) or 'mmdet'
        self.state: Dict[str, Any] = {}
        self._registries: Dict[str, Any] = {}
        self._model_info: Optional[ModelInfo] = None

    # -- launcher ---------------------------------------------------------
    @property
    def distributed(self) -> bool:
        return self.launcher != 'none'

    @property
    def world_size(self) -> int:
        """World size of the run: ``WORLD_SIZE`` (torchrun, slurm) or 1."""
        if not self.distributed:
            return 1
        for var in ('WORLD_SIZE', 'SLURM_NTASKS', 'OMPI_COMM_WORLD_SIZE'):
            if os.environ.get(var, '').isdigit():
                return max(1, int(os.environ[var]))
        return 1

    # -- registries -------------------------------------------------------
    def registry(self, name: str):
        """The registry ``name`` (e.g. ``'MODELS'``) of the default scope.

        This is the registry a ``Runner`` with ``default_scope`` builds from:
        for ``mmdet`` it is ``mmdet.registry.MODELS`` and its parents.
        """
        if name not in self._registries:
            import importlib

            import mmengine.registry as root
            base = getattr(root, name)
            try:  # registers the scope's registries, as Runner does
                importlib.import_module(f'{self.default_scope}.registry')
            except ImportError:
                pass
            # A scope without its own child (mmdet has no FUNCTIONS) builds
            # from the root registry, as MMEngine's build falls back to (an
            # empty child is falsy: a Registry's len is its names').
            child = base._search_child(self.default_scope)
            self._registries[name] = base if child is None else child
        return self._registries[name]

    def lookup(self, registry_name: str, type_name: str):
        """The class registered as ``type_name``, or None."""
        try:
            return self.registry(registry_name).get(type_name)
        except Exception:  # a bad scoped name such as 'mmfoo.Bar'
            return None

    # -- model --------------------------------------------------------------
    def model_info(self) -> ModelInfo:
        """Build the model once, on CPU, without weights or a forward pass."""
        if self._model_info is None:
            model_cfg = self.cfg.get('model', None)
            if model_cfg is None:
                self._model_info = ModelInfo(error='the config has no model')
            else:
                import copy

                from mmengine.registry import DefaultScope
                try:
                    # Nested builds look up the default scope, as in Runner.
                    with DefaultScope.overwrite_default_scope(
                            self.default_scope):
                        model = self.registry('MODELS').build(
                            copy.deepcopy(model_cfg))
                    self._model_info = ModelInfo(model=model)
                except Exception as err:  # reported by the model check
                    self._model_info = ModelInfo(
                        error=f'{type(err).__name__}: {first_line(err)}')
        return self._model_info

    # -- dataloaders ----------------------------------------------------------
    def dataloaders(self) -> Iterator[Tuple[str, Dict]]:
        """``(name, cfg)`` of the dataloaders that the run builds.

        Val and test loaders count only when their loop and evaluator are
        configured, as MMEngine's Runner ignores them otherwise.
        """
        for name in DATALOADERS:
            loader = self.cfg.get(name, None)
            if not isinstance(loader, dict):
                continue
            phase = name.split('_')[0]
            if phase != 'train' and (self.cfg.get(f'{phase}_cfg') is None or
                                     self.cfg.get(f'{phase}_evaluator')
                                     is None):
                continue
            yield name, loader


def first_line(err: BaseException, limit: int = 400) -> str:
    """A short, one-line form of an exception message."""
    text = str(err.args[0]) if (isinstance(err, KeyError)
                                and err.args) else str(err)
    text = ' '.join(text.split())
    return text if len(text) <= limit else text[:limit - 3] + '...'
