"""Calls into IREE's runtime through its C binding alone (``iree._runtime.libs._runtime``), not
its Python layer (``iree.runtime``), which imports ml_dtypes and its array classes: a good
share of the runner's resident memory and of its start (measured: docs/devices.md). What the
runner needs is small: one device, a module per program in a VM context of its own (sharing the
device, so state buffers pass between programs), numpy arrays copied to device buffers, a
program's results as device buffers, and a buffer's values back as numpy."""
from __future__ import annotations

import math

import numpy as np

__all__ = ["Device", "Program"]


def _binding():
    from iree._runtime.libs import _runtime   # IREE's own trampoline (IREE_PY_RUNTIME picks the library)
    return _runtime


class Device:
    """One IREE device of ``driver`` ("local-sync": one thread, the fewest hops per call) and
    its VM instance.

    >>> d = Device()
    >>> d.host(d.buffer(np.arange(3.0))).tolist()
    [0.0, 1.0, 2.0]
    """

    def __init__(self, driver: str = "local-sync"):
        b = self.b = _binding()
        self.device = b.get_cached_hal_driver(driver).create_device_by_uri(driver)
        self.instance = b.VmInstance()
        self.hal = b.create_hal_module(self.instance, self.device)
        # what every copy to the device passes, looked up once (a step copies its input)
        self._copy = self.device.allocator.allocate_buffer_copy
        self._memory, self._usage = b.MemoryType.DEVICE_LOCAL, b.BufferUsage.DEFAULT
        et = b.HalElementType
        self._types = {np.dtype(k): getattr(et, v) for k, v in (
            ("f8", "FLOAT_64"), ("f4", "FLOAT_32"), ("f2", "FLOAT_16"), ("i8", "SINT_64"), ("i4", "SINT_32"),
            ("i2", "SINT_16"), ("i1", "SINT_8"), ("u8", "UINT_64"), ("u4", "UINT_32"), ("u2", "UINT_16"),
            ("u1", "UINT_8"), ("?", "BOOL_8"))}
        self._dtypes = {int(t): dt for dt, t in self._types.items()}
        # a program's results are signless integers where its source said int (MLIR's i32)
        self._dtypes.update({int(getattr(et, f"INT_{8 * n}")): np.dtype(f"i{n}") for n in (1, 2, 4, 8)})

    def buffer(self, a):
        """A device buffer (view) holding a copy of the array ``a``."""
        a = np.asarray(a)
        if not a.flags.c_contiguous:      # (np.ascontiguousarray would make a 0-d array 1-d)
            a = np.ascontiguousarray(a)
        return self._copy(self._memory, self._usage, self.device, a, self._types[a.dtype])

    def view(self, buf):
        """The buffer view of ``buf``: a view, or a program's result as ``Program`` returns it."""
        return buf.deref(self.b.HalBufferView) if isinstance(buf, self.b.VmRef) else buf

    def read(self, buf, dtype: np.dtype, count: int) -> np.ndarray:
        """A numpy copy of the ``count`` values of dtype ``dtype`` a device buffer holds (a
        view or a program's result), flat: ``host`` for a buffer whose type is known. (The
        mapping is read through the buffer protocol: less work than the binding's asarray.)"""
        return np.frombuffer(self.view(buf).map(), dtype, count=count).copy()

    def host(self, buf) -> np.ndarray:
        """A numpy copy of a device buffer's values (a view or a program's result)."""
        view = self.view(buf)
        shape = tuple(view.shape)
        return self.read(view, self._dtypes[int(view.element_type)], math.prod(shape)).reshape(shape)


class Program:
    """The function ``name`` of the IREE module file ``path`` on ``device``: called with device
    buffers or numpy arrays (copied in), it returns its results as device buffers, each held by
    a VM reference (``Device.view`` makes it a buffer view, ``Device.host`` reads it): a call's
    results pass to the next call as they are, not converted (a step's state, every step)."""

    def __init__(self, device: Device, path, name: str = "main"):
        b, self.device = device.b, device
        self.module = b.VmModule.mmap(device.instance, str(path))
        self.context = b.VmContext(device.instance, modules=[device.hal, self.module])
        self.function = self.module.lookup_function(name)
        if self.function is None:
            raise KeyError(f"{path}: no function {name!r}")
        self._held = (b.HalBufferView, b.VmRef)

    def __call__(self, *args) -> list:
        b, d, held = self.device.b, self.device, self._held
        arg_list = b.VmVariantList(len(args))
        for a in args:
            arg_list.push_ref(a if isinstance(a, held) else d.buffer(a))
        ret = b.VmVariantList(len(args) + 4)     # (a capacity: the list grows to the results)
        self.context.invoke(self.function, arg_list, ret)
        return [ret.get_as_ref(i) for i in range(len(ret))]
