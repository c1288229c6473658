"""Recording which compiled CPU attention kernels a test's code path calls."""

from __future__ import annotations

import pytest

from prefixcache.kernels.dispatch import cpu_kernels

CPU_KERNEL_NAMES = ("paged_prefill_attention_cpu", "paged_decode_attention_cpu")


def record_cpu_kernel_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Wrap the compiled CPU kernels (through ``monkeypatch``, undone after the test) so each
    call appends its name to the returned list, then runs the kernel."""
    package = cpu_kernels()
    calls: list[str] = []
    for name in CPU_KERNEL_NAMES:
        original = getattr(package, name)

        def spy(*args, _name=name, _original=original, **kwargs):
            calls.append(_name)
            return _original(*args, **kwargs)

        monkeypatch.setattr(package, name, spy)
    return calls
