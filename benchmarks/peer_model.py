"""The default model as a plain Hugging Face folder (bf16 safetensors, tokenizer.json, the chat
template), for serving the same weights by prefixcache and by a peer such as vLLM.

transformers' ``save_pretrained`` refuses a GGUF-loaded model, so the folder is written from
a plain ``LlamaForCausalLM`` holding the dequantized tensors our loader reads
(``hf_reference.hf_llama_from``); the tokenizer is the one our loader builds from the GGUF
metadata (ids equal Hugging Face's), wrapped for ``save_pretrained``.

    python benchmarks/peer_model.py DEST [--model smollm2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from hf_reference import hf_llama_from

from prefixcache.engine.model_registry import load_model


def export_hf_folder(dest: Path, model: str = "smollm2") -> Path:
    """Write ``model`` as a bf16 HF folder into ``dest`` (kept if it already holds one)."""
    if (dest / "config.json").exists() and (dest / "tokenizer.json").exists():
        return dest
    import transformers

    dest.mkdir(parents=True, exist_ok=True)
    hf = hf_llama_from(model, torch.bfloat16)
    loaded = load_model(model, dtype=torch.float32)
    tokenizer, template = loaded.tokenizer, loaded.chat_template
    eos = tokenizer.eos_token_ids[0] if tokenizer.eos_token_ids else None
    bos = tokenizer.bos_token_id
    hf.config.eos_token_id = eos
    hf.config.bos_token_id = tokenizer.bos_token_id
    hf.generation_config.eos_token_id = eos
    hf.generation_config.bos_token_id = tokenizer.bos_token_id
    hf.save_pretrained(dest, safe_serialization=True)
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer.backend,
        eos_token=None if eos is None else tokenizer.id_to_token(eos),
        bos_token=None if bos is None else tokenizer.id_to_token(bos),
    )
    if template is not None:
        fast.chat_template = template.source
    fast.save_pretrained(dest)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--model", default="smollm2")
    args = parser.parse_args()
    print(export_hf_folder(args.dest, args.model))


if __name__ == "__main__":
    main()
