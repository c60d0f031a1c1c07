"""The op library: fast implementations of common model pieces, each with an eager reference.

Attention (``attention``, ``AttentionOp``, ``SelfAttention``, HF adapters via
``attention_from_hf``), fused element-wise ops (``bias_gelu``, ``bias_dropout_residual`` ...),
MLPs (``MLP``, ``GatedMLP``, ``mlp_from_hf``), the fused sub-layer epilogue of BERT/RoBERTa
(``DenseDropoutResidualNorm``, ``residual_norm_from_hf``), conv+BatchNorm folding for inference
(``fuse_conv_bn``, ``fuse_conv_bn_split``, ``ChannelBias``), a debugging identity that logs
tensor statistics on every rank (``TensorLog``, ``insert_log``). Used with
``sch[path].replace(...)``.
Builders from HF modules record the parameter provenance ``slapo.verify`` uses
(:mod:`slapo.provenance`).
"""

from .attention import (
    BACKENDS,
    AttentionOp,
    attention,
    attention_reference,
    padding_mask,
    repeat_kv,
)
from .conv_bn import ChannelBias, fold_conv_bn, fuse_conv_bn, fuse_conv_bn_split
from .debug import TensorLog, insert_log, tensor_summary
from .fused import (
    FusedBiasDropoutResidual,
    FusedBiasGeLU,
    LinearBiasGeLU,
    bias_dropout_residual,
    bias_dropout_residual_layer_norm,
    bias_dropout_residual_layer_norm_reference,
    bias_dropout_residual_reference,
    bias_gelu,
    bias_gelu_reference,
)
from .hf_attention import (
    HFAlbertAttention,
    HFBertSelfAttention,
    HFGPT2Attention,
    HFGPTNeoSelfAttention,
    HFLlamaAttention,
    HFOPTAttention,
    attention_from_hf,
)
from .hf_t5_attention import HFT5Attention
from .mlp import MLP, DenseActivation, GatedMLP, mlp_from_hf
from .residual_norm import DenseDropoutResidualNorm, residual_norm_from_hf
from .self_attention import SelfAttention, apply_rotary, fuse_qkv, split_qkv

__all__ = [
    "BACKENDS", "attention", "attention_reference", "AttentionOp", "padding_mask", "repeat_kv",
    "SelfAttention", "fuse_qkv", "split_qkv", "apply_rotary",
    "attention_from_hf", "HFBertSelfAttention", "HFAlbertAttention", "HFGPT2Attention",
    "HFGPTNeoSelfAttention", "HFOPTAttention", "HFLlamaAttention", "HFT5Attention",
    "bias_gelu", "bias_gelu_reference", "bias_dropout_residual",
    "bias_dropout_residual_reference", "bias_dropout_residual_layer_norm",
    "bias_dropout_residual_layer_norm_reference", "FusedBiasGeLU", "FusedBiasDropoutResidual",
    "LinearBiasGeLU",
    "MLP", "GatedMLP", "DenseActivation", "mlp_from_hf",
    "DenseDropoutResidualNorm", "residual_norm_from_hf",
    "fuse_conv_bn", "fuse_conv_bn_split", "fold_conv_bn", "ChannelBias",
    "TensorLog", "insert_log", "tensor_summary",
]
