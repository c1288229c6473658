"""A counter that moves whenever a watched ``nn.Module`` gets a submodule or a parameter assigned.

Plans derived from a model's structure (which modules and weights it holds) stay valid while
the counter stays put, so they can be cached without walking the model on every call. A model
whose plans are cached is ``watch``-ed: torch's global registration hooks move the counter only
when the module being assigned to is one of the watched ones (a submodule assigned into a
watched module is watched from then on). Modules elsewhere in the process, such as the new
``ModuleList`` that slicing one builds on every call of a transformers forward, leave the
counter alone.
"""

from __future__ import annotations

import threading
import weakref

from torch import nn
from torch.nn.modules import module as nn_module

_lock = threading.Lock()
_generation = 0
_watched: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def _moved(module: nn.Module, _name: str, value: object) -> None:
    global _generation
    with _lock:
        if module not in _watched:
            return
        _generation += 1
        if isinstance(value, nn.Module):
            _watched.update(value.modules())


nn_module.register_module_module_registration_hook(_moved)
nn_module.register_module_parameter_registration_hook(_moved)


def watch(root: nn.Module) -> None:
    """From now on, a submodule or parameter assigned to ``root`` or any module under it
    moves the counter."""
    with _lock:
        _watched.update(root.modules())


def structure_generation() -> int:
    """The counter's value now: a different value means a watched module's structure changed."""
    return _generation
