"""A counter that moves whenever any ``nn.Module`` gets a submodule or a parameter assigned.

Plans derived from a model's structure (which modules and weights it holds) stay valid while
the counter stays put, so they can be cached without walking the model on every call. The
counter is process-wide, through torch's global registration hooks: it also moves for modules
that have nothing to do with a cached plan, which only costs a recomputation.
"""

from __future__ import annotations

import threading

from torch.nn.modules import module as nn_module

_lock = threading.Lock()
_generation = 0


def _moved(*_: object) -> None:
    global _generation
    with _lock:
        _generation += 1


nn_module.register_module_module_registration_hook(_moved)
nn_module.register_module_parameter_registration_hook(_moved)


def structure_generation() -> int:
    """The counter's value now: a different value means some module's structure changed."""
    return _generation
