"""ATen operator calls and host-device synchronisations, counted as they are dispatched.

On a GPU every compute operator is at least one kernel launch and every operator a pass through
PyTorch's dispatcher on the host, so the number of operator calls of a training step measures
its host work, and it can be counted on a CPU, where it is deterministic. A
*synchronisation* is an operator whose result the host must wait for: the host can no longer
run ahead of the device and queue the next kernels. Counted as such (they would wait on a GPU;
on a CPU they cost nothing):

* ``aten::_local_scalar_dense``: ``.item()``, ``float(t)``, ``int(t)``, ``bool(t)`` (an ``if``
  on a tensor);
* ``aten::nonzero``, ``aten::masked_select``, ``unique``, ``bincount``, ``repeat_interleave``
  without ``output_size``: outputs whose size depends on the values;
* indexing or index assignment with a boolean mask (``x[mask]``, ``x[mask] = v``: a
  ``nonzero`` inside);
* ``aten::equal``, ``aten::allclose``, ``aten::is_nonzero``: a Python bool out of tensors;
* a copy from a device tensor to the host.

Not seen: ``Tensor.tolist()`` and ``.numpy()`` of a tensor already on the host do not dispatch
(on a GPU the copy they need would be counted). The GPU check's ``torch.cuda.set_sync_debug_mode``
step covers the rest.

This module imports nothing of the plugin, so that the probe that uses it
(:mod:`.train_step_probe`) can run in a stock fairseq process.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from typing import Any, Dict, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: Operators that always make the host wait for the device, by schema name.
ALWAYS_SYNC = frozenset({
    "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::equal",
    "aten::allclose", "aten::is_nonzero", "aten::_unique", "aten::_unique2", "aten::unique_dim",
    "aten::unique_consecutive", "aten::unique_dim_consecutive", "aten::bincount",
    "aten::argwhere",
})
#: Operators that make the host wait when an index is boolean (a nonzero inside).
SYNC_WITH_BOOLEAN_INDEX = frozenset({
    "aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_",
})
#: Copies that make the host wait when they bring a device tensor to the host.
COPIES = frozenset({"aten::_to_copy", "aten::copy_", "aten::to"})

_TORCH_DIR = os.path.dirname(torch.__file__)


class HostSyncError(RuntimeError):
    """An operator that makes the host wait for the device ran where none may."""


def _boolean(value: Any) -> bool:
    return torch.is_tensor(value) and value.dtype in (torch.bool, torch.uint8)


def sync_kind(func: Any, args: tuple, kwargs: Dict[str, Any]) -> Optional[str]:
    """The reason why the operator call ``func(*args, **kwargs)`` makes the host wait for the
    device, or None if it does not."""
    name = func._schema.name
    if name in ALWAYS_SYNC:
        return name
    if name in SYNC_WITH_BOOLEAN_INDEX:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(_boolean(index) for index in indices or ()):
            return f"{name} with a boolean index"
        return None
    if name == "aten::repeat_interleave" and torch.is_tensor(args[0] if args else None):
        if kwargs.get("output_size") is None and (len(args) < 4 or args[3] is None):
            return "aten::repeat_interleave without output_size"
        return None
    if name in COPIES:
        source = args[1] if name == "aten::copy_" else args[0]
        target_device = args[0].device if name == "aten::copy_" else kwargs.get("device")
        if torch.is_tensor(source) and source.device.type != "cpu" and target_device is not None \
                and torch.device(target_device).type == "cpu":
            return f"{name} from {source.device.type} to the host"
    return None


def caller(skip_torch: bool = True) -> str:
    """``file:line`` of the innermost Python frame outside torch and this module: the code
    that called the operator."""
    for frame in reversed(traceback.extract_stack()[:-1]):
        path = frame.filename
        if path == __file__ or (skip_torch and path.startswith(_TORCH_DIR)):
            continue
        return f"{path}:{frame.lineno}"
    return "?"


class OperatorCounter(TorchDispatchMode):
    """Counts every ATen operator call dispatched in its ``with`` block: compute operators and
    views apart (``compute``, ``views``), host synchronisations (``syncs``, with where they were
    called: ``sync_callers``), and those inside a forward or backward pass (between
    :meth:`enter_forward_backward` and :meth:`leave_forward_backward`:
    ``syncs_in_forward_backward``).

    ``fail_on_sync``: raise :class:`HostSyncError` on the first synchronisation (naming the
    operator and its caller), or only on one inside a forward or backward pass
    (``"forward_backward"``).
    """

    def __init__(self, fail_on_sync: Any = False) -> None:
        super().__init__()
        self.fail_on_sync = fail_on_sync
        self.compute: Counter = Counter()
        self.views: Counter = Counter()
        self.syncs: Counter = Counter()
        self.syncs_in_forward_backward: Counter = Counter()
        self.sync_callers: Counter = Counter()
        self.in_forward_backward = 0

    def enter_forward_backward(self) -> None:
        self.in_forward_backward += 1

    def leave_forward_backward(self) -> None:
        self.in_forward_backward -= 1

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        (self.views if func.is_view else self.compute)[name] += 1
        kind = sync_kind(func, args, kwargs)
        if kind is not None:
            where = caller()
            self.syncs[kind] += 1
            self.sync_callers[f"{kind} at {where}"] += 1
            inside = self.in_forward_backward > 0
            if inside:
                self.syncs_in_forward_backward[kind] += 1
            if self.fail_on_sync is True or (self.fail_on_sync == "forward_backward" and inside):
                raise HostSyncError(f"{kind} makes the host wait for the device, at {where}")
        return func(*args, **kwargs)

    def totals(self) -> Dict[str, int]:
        """``{"compute": n, "views": n, "syncs": n, "syncs_in_forward_backward": n}``."""
        return {"compute": sum(self.compute.values()), "views": sum(self.views.values()),
                "syncs": sum(self.syncs.values()),
                "syncs_in_forward_backward": sum(self.syncs_in_forward_backward.values())}
