"""The model's cached plan of fused layers lasts while its own modules stay the same: module
activity elsewhere in the process (a transformers forward slices its ModuleList on every call)
keeps it, a change to one of the model's modules or parameters drops it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from prefixcache.engine.llm import LLM
from prefixcache.engine.model.structure_generation import structure_generation, watch
from prefixcache.engine.sampling_params import SamplingParams
from prefixcache.kernels.dispatch import cpu_kernels

GREEDY = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)


def test_only_watched_modules_move_the_counter() -> None:
    watched, elsewhere = nn.Sequential(nn.Linear(4, 4)), nn.Sequential(nn.Linear(4, 4))
    watch(watched)
    start = structure_generation()
    elsewhere.append(nn.ReLU())
    elsewhere[0].weight = nn.Parameter(torch.zeros(4, 4))
    nn.ModuleList(list(watched))  # watched modules put into a new, unwatched container
    assert structure_generation() == start

    added = nn.Sequential(nn.Linear(4, 4))
    watched.append(added)  # assigned into a watched module: moves, and is watched from now on
    after_add = structure_generation()
    assert after_add > start
    added[0].bias = nn.Parameter(torch.ones(4))
    assert structure_generation() > after_add


@pytest.mark.skipif(
    not cpu_kernels().cpu_attention_available(), reason="the compiled CPU kernels are unavailable"
)
def test_the_plan_survives_other_modules_and_follows_the_models_own(
    tiny_llama_hd64_dir: Path,
) -> None:
    llm = LLM(str(tiny_llama_hd64_dir), dtype="bfloat16", num_blocks=32, block_size=4)
    model = llm.engine.runner.model
    expected = llm.generate([[5, 6, 7, 8, 9]], GREEDY)[0].token_ids
    plan = model._fused_layers()
    assert plan is not None

    _ = model.layers[:2]  # a new ModuleList holding two of the model's layers
    _ = nn.Linear(8, 8)
    assert model._fused_layers() is plan  # not rebuilt

    # a plain projection in one layer: that layer cannot run fused, so no plan
    layer = model.layers[1]
    packed_down = layer.mlp.down_proj
    layer.mlp.down_proj = nn.Linear(
        packed_down.in_features, packed_down.out_features, bias=False, dtype=torch.bfloat16
    ).requires_grad_(False)
    assert model._fused_layers() is None
    assert len(llm.generate([[5, 6, 7, 8, 9]], GREEDY)[0].token_ids) == 3  # op by op

    layer.mlp.down_proj = packed_down
    restored = model._fused_layers()
    assert restored is not None and restored is not plan
    assert llm.generate([[5, 6, 7, 8, 9]], GREEDY)[0].token_ids == expected
    llm.cache.check_invariants()
    assert llm.stats()["in_use"] == 0
