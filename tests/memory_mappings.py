"""What the kernel says about this process's memory mappings (/proc/self/smaps)."""

from __future__ import annotations

from pathlib import Path


def vm_flags_of(address: int) -> set[str]:
    """The VmFlags of the mapping holding ``address`` ("hg": advised for huge pages)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            inside = start <= address < end
        elif inside and line.startswith("VmFlags:"):
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")
