"""Which device the engine runs on, checked once up front with a clear error."""

from __future__ import annotations

import torch


def resolve_device(device: str | torch.device | None) -> torch.device:
    """``None`` -> CPU. ValueError for a malformed name or an accelerator this process lacks
    (so a bad ``device=`` fails before any weight is loaded)."""
    if device is None:
        return torch.device("cpu")
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        resolved = torch.device(device)
    except RuntimeError:
        raise ValueError(f"unknown device {str(device)!r}: use 'cpu', 'cuda' or 'cuda:N'") from None
    if resolved.type == "cpu":
        return resolved
    if resolved.type != "cuda":
        raise ValueError(f"device {str(device)!r} is not supported: use 'cpu', 'cuda' or 'cuda:N'")
    if not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} requested but this machine has no CUDA device")
    count = torch.cuda.device_count()
    index = 0 if resolved.index is None else resolved.index
    if index >= count:
        raise ValueError(f"device {str(device)!r} does not exist: {count} CUDA device(s) visible")
    return torch.device("cuda", index)
