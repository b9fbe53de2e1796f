"""r3: a pure-PyTorch research reference for Rollout Routing Replay (R3) in MoE reinforcement learning."""
from r3.model import ModelConfig, PRESETS, Transformer, build_model  # noqa: F401
from r3.moe import RoutesError  # noqa: F401
from r3.hf import CheckpointError, load_pretrained, load_tokenizer, save_pretrained  # noqa: F401
