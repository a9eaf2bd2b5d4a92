"""Paired (visible + infrared) datasets, dataset wrappers and transforms."""
from .llvip import LLVIPDataset  # noqa: F401,E402
from .flir_aligned import FLIRAlignedDataset  # noqa: F401,E402
from .kaist import KAISTDataset  # noqa: F401,E402
from .m3fd import M3FDDataset  # noqa: F401,E402
from .paired_dataset import PairedModalityDataset  # noqa: F401,E402
from .synthetic_llvip import ensure_synthetic_llvip  # noqa: F401,E402
from . import transforms  # noqa: F401,E402
from .valid_instance_resample import ValidInstanceResampleDataset  # noqa
