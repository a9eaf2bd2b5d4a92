"""The one place where mmsafe asks which PyTorch API is there.

Everything that differs between the supported torch releases (2.1 to the
newest) is detected here, by probing the API itself, never by comparing
version strings. The rest of mmsafe calls these functions.
"""
from .torch_features import (autocast_dtype, autocast_enabled,
                             cpu_autocast_dtypes, ddp_reduction_check,
                             default_store_address,
                             grad_scaler, numpy_pickle_functions,
                             numpy_to_tensor, plain_tensor_dtypes,
                             sgd_has_fused, storage_dtypes,
                             supports_tensor_dtype, tensor_dtypes)

__all__ = [
    'autocast_dtype', 'autocast_enabled', 'cpu_autocast_dtypes',
    'ddp_reduction_check', 'default_store_address',
    'grad_scaler', 'numpy_pickle_functions', 'numpy_to_tensor',
    'plain_tensor_dtypes', 'sgd_has_fused', 'storage_dtypes',
    'supports_tensor_dtype', 'tensor_dtypes'
]
