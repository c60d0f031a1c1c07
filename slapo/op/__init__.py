"""The op library: fast implementations of common model pieces, each with an eager reference.

Attention (``attention``, ``AttentionOp``, ``SelfAttention``, HF adapters via
``attention_from_hf``; ``cpu_dropout_kernel`` swaps the CPU kernel taken with dropout in a
scope), fused element-wise ops (``bias_gelu``, ``bias_dropout_residual`` ...),
MLPs (``MLP``, ``GatedMLP``, ``mlp_from_hf``), the fused sub-layer epilogue of BERT/RoBERTa
(``DenseDropoutResidualNorm``, ``residual_norm_from_hf``), conv+BatchNorm folding for inference
(``fuse_conv_bn``, ``fuse_conv_bn_split``, ``ChannelBias``), a dropout with a cheap CPU mask
(``Dropout``, ``dropout``), a one-function RMSNorm (``RMSNorm``, ``rms_norm``), the
tensor-parallel Linears that ``sync`` puts in place (``LinearWithSync``: bias after the
reduction; ``LinearWithGradSync``: input-gradient all-reduce overlapped with the weight
gradient), a debugging identity that logs tensor statistics on every rank (``TensorLog``,
``insert_log``). Used with ``sch[path].replace(...)``.
Builders from HF modules record the parameter provenance ``slapo.verify`` uses
(:mod:`slapo.provenance`).
"""

from ..errors import original_name, register_original_names
from .attention import (
    BACKENDS,
    AttentionOp,
    attention,
    attention_reference,
    cpu_dropout_kernel,
    padding_mask,
    repeat_kv,
)
from .conv_bn import ChannelBias, fold_conv_bn, fuse_conv_bn, fuse_conv_bn_split
from .debug import TensorLog, insert_log, tensor_summary
from .dropout import Dropout, dropout
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
from .linear import LinearWithGradSync, LinearWithSync
from .residual_norm import DenseDropoutResidualNorm, residual_norm_from_hf
from .rms_norm import RMSNorm, rms_norm
from .self_attention import SelfAttention, apply_rotary, fuse_qkv, split_qkv

__all__ = [
    "BACKENDS", "attention", "attention_reference", "AttentionOp", "padding_mask", "repeat_kv",
    "cpu_dropout_kernel",
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
    "Dropout", "dropout", "RMSNorm", "rms_norm", "LinearWithSync", "LinearWithGradSync",
]

# Ops of the original Slapo that are spelled differently here (docs/porting.md).
_ORIGINAL_NAMES = {
    "FlashAttention": "slapo.op.attention_from_hf(hf_attention_module) builds the replacement "
                      "of an HF attention (slapo.op.SelfAttention for a new model)",
    "FlashAttentionOp": "slapo.op.AttentionOp (backends 'auto', 'flash', 'efficient', 'math' "
                        "through torch's scaled_dot_product_attention)",
    "FusedMLP": "slapo.op.mlp_from_hf(hf_mlp_module) (slapo.op.MLP for a new model)",
    "FusedQKV": "slapo.op.fuse_qkv (and slapo.op.split_qkv)",
    "LinearWithSeparateBias": "sch[path].decompose() swaps a Linear for one",
    "LinearWithSyncFunc": "slapo.op.linear.LinearWithSync (sync('fwd_post', 'all_reduce') on a "
                          "row-parallel Linear with a bias puts it in place)",
    "LinearWithAct": "slapo.op.LinearBiasGeLU",
    "LinearWithDropout": "slapo.op.bias_dropout_residual after sch[path].decompose()",
    "ParallelCrossEntropy": "slapo.op.cross_entropy.VocabParallelCrossEntropy",
    "vocab_parallel_cross_entropy": "slapo.op.cross_entropy.vocab_parallel_cross_entropy",
    "bias_new_gelu": "slapo.op.bias_gelu(x, bias, approximate='tanh')",
    "new_gelu": "torch.nn.functional.gelu(x, approximate='tanh')",
    "bias_dropout": "slapo.op.bias_dropout_residual(x, bias, None, p, training)",
    "Print": "slapo.op.TensorLog (an identity that logs shape, dtype and statistics per rank; "
             "slapo.op.insert_log puts one into a traced graph)",
}


register_original_names("slapo.op", _ORIGINAL_NAMES)


def __getattr__(name: str):
    raise original_name("slapo.op", name, _ORIGINAL_NAMES)
