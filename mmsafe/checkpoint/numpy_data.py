"""numpy arrays, scalars and dtypes of a checkpoint, plain data only.

numpy pickles (protocol 2, as ``torch.save`` writes):

* a dtype as ``numpy.dtype(code, False, True)`` then ``BUILD`` with
  ``(3, byteorder, None, None, None, elsize, alignment, flags)``;
* an array as ``_reconstruct(numpy.ndarray, (0,), b'b')`` then ``BUILD``
  with ``(1, shape, dtype, is_fortran, raw bytes)``;
* a scalar as ``scalar(dtype, raw bytes)``;
* under protocol 5, an array as ``_frombuffer(bytes, dtype, shape,
  order)``.

Only those exact forms are accepted, for dtypes of plain data (booleans,
integers, floats, complex numbers, byte and unicode strings): object,
structured, void and datetime dtypes are refused, however a file reaches
them (a ``NEWOBJ`` of a dtype, an ``'O'`` code, a list of objects as an
array's data, ``ndarray.__setstate__`` through another callable). A dtype's
state must be the one numpy writes for its code; an array's bytes must be
exactly its shape's worth.
"""
import re
from typing import Any, Callable, Dict

import numpy as np

from mmsafe.compat import numpy_pickle_functions
from .tokens import (Token, describe, exact_bool, exact_int, expect_args,
                     refuse)

#: dtype codes numpy pickles for plain data
DTYPE_CODE = re.compile(r'(b1|[iu][1248]|f[248]|f16|c8|c16|c32|'
                        r'[SU][0-9]{1,9})$')
PLAIN_KINDS = frozenset('biufcSU')
MAX_DIMS = 64


def plain_dtype(dtype: Any) -> bool:
    """Whether ``dtype`` is a numpy dtype of plain data."""
    return (isinstance(dtype, np.dtype) and dtype.kind in PLAIN_KINDS
            and not dtype.hasobject and dtype.names is None
            and dtype.subdtype is None and dtype.metadata is None)


def _check_dtype(dtype: Any, what: str) -> np.dtype:
    if not plain_dtype(dtype):
        raise refuse(f'{what} of dtype {describe(dtype)}: only dtypes of '
                     'plain data '
                     '(no object, structured or datetime dtypes)')
    return dtype


class NumpyObjects:
    """The numpy part of the checkpoint allowlist, for one load.

    Args:
        expect_build (Callable): registers an object made by this load
            with the function that may ``BUILD`` it (once).
    """

    def __init__(self, expect_build: Callable[[Any, Callable], None]):
        self.expect_build = expect_build
        self.functions = numpy_pickle_functions()
        self.ndarray = Token('numpy.ndarray')

    def globals(self) -> Dict[str, Any]:
        found: Dict[str, Any] = {
            'numpy.ndarray': self.ndarray,
            'numpy.dtype': Token('numpy.dtype', call=self.dtype)}
        checks = {'_reconstruct': self.reconstruct, 'scalar': self.scalar,
                  '_frombuffer': self.frombuffer}
        for name in self.functions:
            found[name] = Token(name, call=checks[name.rsplit('.', 1)[1]])
        return found

    def _function(self, name: str) -> Callable:
        return next(fn for key, fn in self.functions.items()
                    if key.endswith('.' + name))

    # ---------------------------------------------------------- dtypes --
    def dtype(self, args: tuple) -> np.dtype:
        expect_args('numpy.dtype', args, 3)
        code, align, copy = args
        if type(code) is not str or not DTYPE_CODE.match(code):
            raise refuse(f'numpy.dtype({describe(code)}): only the codes '
                         'of plain data')
        dtype = np.dtype(code, exact_bool(align, 'align'),
                         exact_bool(copy, 'copy'))
        _check_dtype(dtype, 'numpy.dtype')
        self.expect_build(dtype, self.build_dtype)
        return dtype

    @staticmethod
    def build_dtype(dtype: np.dtype, state: Any) -> None:
        """The state numpy writes for this dtype in the byte order that
        ``state`` names, and nothing else."""
        if type(state) is not tuple or len(state) != 8 or any(
                type(item) not in (int, str, type(None)) for item in state) \
                or state[1] not in ('<', '>', '|'):
            raise refuse(f'a numpy dtype state {describe(state)}')
        order = state[1]
        expected = dtype if order == '|' else dtype.newbyteorder(order)
        if expected.__reduce__()[2] != state:
            raise refuse(f'a numpy dtype state {describe(state)} that numpy '
                         f'does not write for {dtype}')
        dtype.__setstate__(state)
        _check_dtype(dtype, 'a numpy dtype')

    # ---------------------------------------------------------- arrays --
    def reconstruct(self, args: tuple) -> np.ndarray:
        expect_args('numpy _reconstruct', args, 3)
        cls, shape, code = args
        if cls is not self.ndarray or type(shape) is not tuple or \
                len(shape) != 1 or type(shape[0]) is not int or \
                shape[0] != 0 or type(code) is not bytes or code != b'b':
            raise refuse('numpy _reconstruct other than of an empty '
                         "numpy.ndarray ((0,), b'b')")
        array = self._function('_reconstruct')(np.ndarray, (0, ), b'b')
        self.expect_build(array, self.build_array)
        return array

    @staticmethod
    def build_array(array: np.ndarray, state: Any) -> None:
        if type(state) is not tuple or len(state) != 5:
            raise refuse(f'a numpy array state of {type(state).__qualname__}')
        version, shape, dtype, fortran, data = state
        exact_int(version, 'the array state version', 1, 1)
        if type(shape) is not tuple or len(shape) > MAX_DIMS:
            raise refuse('a numpy array shape that is not a tuple of at most '
                         f'{MAX_DIMS} integers')
        count = 1
        for n in shape:
            count *= exact_int(n, 'a numpy array size')
        _check_dtype(dtype, 'a numpy array')
        exact_bool(fortran, 'is_fortran')
        if type(data) is not bytes:
            raise refuse(f'numpy array data of type {type(data).__qualname__}'
                         ' (plain arrays pickle their data as bytes)')
        if len(data) != count * dtype.itemsize:
            raise refuse(f'a numpy array of shape {shape} and dtype {dtype} '
                         f'with {len(data)} bytes of data')
        array.__setstate__(state)

    def scalar(self, args: tuple) -> np.generic:
        expect_args('numpy scalar', args, 2)
        dtype, data = args
        _check_dtype(dtype, 'a numpy scalar')
        if type(data) is not bytes or len(data) != dtype.itemsize:
            raise refuse(f'a numpy {dtype} scalar whose data is not '
                         f'{dtype.itemsize} bytes')
        return self._function('scalar')(dtype, data)

    def frombuffer(self, args: tuple) -> np.ndarray:
        """Protocol 5: ``_frombuffer(data, dtype, shape, order)``, the data
        in band (bytes or bytearray)."""
        expect_args('numpy _frombuffer', args, 4)
        data, dtype, shape, order = args
        _check_dtype(dtype, 'a numpy array')
        if type(data) not in (bytes, bytearray) or \
                type(shape) is not tuple or len(shape) > MAX_DIMS or \
                type(order) is not str or order not in ('C', 'F'):
            raise refuse('numpy _frombuffer other than of in-band bytes, a '
                         "shape and the order 'C' or 'F'")
        count = 1
        for n in shape:
            count *= exact_int(n, 'a numpy array size')
        if len(data) != count * dtype.itemsize:
            raise refuse(f'a numpy array of shape {describe(shape)} and dtype '
                         f'{dtype} with {len(data)} bytes of data')
        return self._function('_frombuffer')(data, dtype, shape, order)
