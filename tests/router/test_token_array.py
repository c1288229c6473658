"""token_array: what the router takes as a prompt's token ids."""

from __future__ import annotations

import numpy as np
import pytest

from prefixcache.integrations.router.request_tokens import token_array


def test_ids_become_int32_and_an_int32_array_is_not_copied() -> None:
    assert token_array([5, 0, 7]).dtype == np.int32
    assert token_array(np.array([5, 0, 7], dtype=np.int64)).tolist() == [5, 0, 7]
    ids = np.array([5, 0, 7], dtype=np.int32)
    assert token_array(ids) is ids
    assert token_array(np.zeros(0, dtype=np.int32)).shape == (0,)


@pytest.mark.parametrize("ids", [
    [-1, 2], [2**31], np.array([3, -1], dtype=np.int32), np.array([2**31], dtype=np.int64),
    [[1, 2], [3, 4]], np.zeros((2, 2), dtype=np.int32),
])  # fmt: skip
def test_what_is_no_token_id_is_refused(ids) -> None:
    with pytest.raises((ValueError, TypeError, OverflowError)):
        token_array(ids)
