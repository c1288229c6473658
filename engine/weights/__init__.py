"""Weight loading: Hugging Face folders (safetensors) and GGUF files, into `CausalLM`."""

from .gguf_file import GGUFFile
from .hf_folder import read_hf_config, read_hf_state_dict
from .state_dict import build_model, fuse_hf_state_dict

__all__ = ["GGUFFile", "build_model", "fuse_hf_state_dict", "read_hf_config",
           "read_hf_state_dict"]
