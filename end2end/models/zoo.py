"""The model zoo table: every model name a benchmark config may use, as architecture sizes.

Nothing is downloaded: names map to :class:`ModelSpec` (the hyperparameters of the public
checkpoint, or of the paper's resized models), and ``end2end.models`` builds randomly initialised
models from them. Sizes of public models are those of their published HF configs; entries marked
``note="reconstructed"`` were not recoverable exactly (see end2end/README.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Dict, Tuple

__all__ = ["ModelSpec", "ZOO", "FAMILIES", "CAUSAL_FAMILIES", "VOCAB_MULTIPLE", "padded_vocab"]

FAMILIES = ("bert", "roberta", "albert", "gpt2", "gpt_neo", "opt", "t5", "llama", "wideresnet",
            "qwen3", "mistral", "gemma3", "phi3", "mixtral", "qwen3_moe")
# Causal-LM (decoder-only) families; today's (issue 27) have no hand recipe: schedule "auto".
CAUSAL_FAMILIES = ("gpt2", "gpt_neo", "opt", "llama", "qwen3", "mistral", "gemma3", "phi3",
                   "mixtral", "qwen3_moe")


@dataclass(frozen=True)
class ModelSpec:
    """Architecture hyperparameters of one benchmark model (transformer or WideResNet).

    Transformer fields: ``layers`` (encoder layers for T5), ``decoder_layers`` (T5 only),
    ``hidden``, ``heads``, ``kv_heads`` (GQA; 0 = heads), ``head_dim`` (0 = hidden // heads),
    ``ffn`` (real intermediate size), ``gated_ffn`` (SwiGLU-style: three FFN matrices),
    ``vocab``, ``max_positions`` (usable sequence length), ``embedding_size`` (ALBERT's factorised
    embedding / OPT's ``word_embed_proj_dim``; 0 = hidden).
    Mixture of experts: ``experts`` (experts per MoE layer; 0 = dense), ``experts_per_token``
    (top-k); ``ffn`` is then the size of one expert's (gated) FFN.
    ``schedule``: the ``slapo.model_schedule`` recipe of the Slapo modes: the family's hand
    recipe (default: the family's name), or ``"auto"`` (derived from the HF config's
    tensor-parallel plan) for the families that have none.
    WideResNet fields: ``block_layers`` (4 Bottleneck counts), ``width_per_group``,
    ``image_size``, ``num_classes``.
    """

    name: str
    family: str
    label: str = ""
    layers: int = 0
    hidden: int = 0
    heads: int = 0
    ffn: int = 0
    vocab: int = 0
    max_positions: int = 0
    decoder_layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    embedding_size: int = 0
    gated_ffn: bool = False
    block_layers: Tuple[int, ...] = ()
    width_per_group: int = 64
    image_size: int = 224
    num_classes: int = 1000
    experts: int = 0
    experts_per_token: int = 0
    schedule: str = ""
    extra: Tuple[Tuple[str, Any], ...] = ()
    note: str = ""

    def __post_init__(self) -> None:
        if not self.schedule:  # a hand recipe named after the family
            object.__setattr__(self, "schedule", self.family)

    @property
    def is_moe(self) -> bool:
        """A mixture-of-experts model (``experts`` > 0)."""
        return self.experts > 0

    @property
    def is_encoder_decoder(self) -> bool:
        return self.family == "t5"

    @property
    def is_vision(self) -> bool:
        return self.family == "wideresnet"

    @property
    def is_causal(self) -> bool:
        return self.family in CAUSAL_FAMILIES

    @property
    def dim_per_head(self) -> int:
        return self.head_dim or (self.hidden // self.heads if self.heads else 0)

    @property
    def attn_dim(self) -> int:
        """Width of the query/output projections (heads x head_dim)."""
        return self.heads * self.dim_per_head

    @property
    def kv_dim(self) -> int:
        """Width of the key/value projections (kv_heads x head_dim)."""
        return (self.kv_heads or self.heads) * self.dim_per_head

    @property
    def emb_dim(self) -> int:
        return self.embedding_size or self.hidden

    def replace(self, **changes: Any) -> "ModelSpec":
        """A copy with ``changes`` applied (frozen dataclass)."""
        return dataclasses.replace(self, **changes)


ZOO: Dict[str, ModelSpec] = {}


#: Vocabularies not divisible by 8 are padded to a multiple of this, as Megatron-LM pads its own
#: (``--make-vocab-size-divisible-by 128``) and the artifact padded the others: a vocab-parallel
#: embedding at TP 2, 4 or 8 needs a divisible size (BERT's 30522 is not), and every system of
#: a comparison trains the same padded model. The published size stays in ``note``.
VOCAB_MULTIPLE = 128


def padded_vocab(vocab: int) -> int:
    """``vocab``, or the next multiple of :data:`VOCAB_MULTIPLE` when 8 does not divide it."""
    return vocab if vocab % 8 == 0 else -(-vocab // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def _add(name: str, family: str, label: str = "", **fields: Any) -> None:
    assert name not in ZOO, name
    vocab = fields.get("vocab", 0)
    if vocab and padded_vocab(vocab) != vocab:
        fields["vocab"] = padded_vocab(vocab)
        pad = f"vocab {vocab} padded to {fields['vocab']}"
        fields["note"] = f"{fields['note']}; {pad}" if fields.get("note") else pad
    ZOO[name] = ModelSpec(name=name, family=family, label=label or name, **fields)


# ---- BERT / RoBERTa / ALBERT (encoders, masked-LM head) --------------------------------------
_add("bert-base-uncased", "bert", "BERT-base", layers=12, hidden=768, heads=12, ffn=3072,
     vocab=30522, max_positions=512)
_add("bert-large-uncased", "bert", "BERT-large", layers=24, hidden=1024, heads=16, ffn=4096,
     vocab=30522, max_positions=512)
# Paper Figure 7 "BERT-1B": bert-large resized to h=2048 and 1024 positions; FFN stays 4096.
_add("bert-xlarge", "bert", "BERT-1B", layers=24, hidden=2048, heads=16, ffn=4096,
     vocab=30522, max_positions=1024)
_add("roberta-base", "roberta", "RoBERTa-base", layers=12, hidden=768, heads=12, ffn=3072,
     vocab=50265, max_positions=512)
_add("roberta-large", "roberta", "RoBERTa-large", layers=24, hidden=1024, heads=16, ffn=4096,
     vocab=50265, max_positions=512)
# Paper Figure 7 "RoBERTa-1.3B": roberta-large resized to h=2048, FFN 8192.
_add("roberta-xlarge", "roberta", "RoBERTa-1.3B", layers=24, hidden=2048, heads=16, ffn=8192,
     vocab=50265, max_positions=512)
_add("albert-base-v2", "albert", "ALBERT-base", layers=12, hidden=768, heads=12, ffn=3072,
     vocab=30000, max_positions=512, embedding_size=128)
_add("albert-large-v2", "albert", "ALBERT-large", layers=24, hidden=1024, heads=16, ffn=4096,
     vocab=30000, max_positions=512, embedding_size=128)

# ---- GPT-2 / GPT-Neo / OPT / LLaMA (decoders, causal-LM head) --------------------------------
for _name, _l, _h, _a in (("gpt2", 12, 768, 12), ("gpt2-medium", 24, 1024, 16),
                          ("gpt2-large", 36, 1280, 20), ("gpt2-xl", 48, 1600, 25)):
    _add(_name, "gpt2", _name.upper().replace("GPT2", "GPT-2"), layers=_l, hidden=_h, heads=_a,
         ffn=4 * _h, vocab=50257, max_positions=1024)
# Figure 8 "GPT-10B" (multi-node): the exact shape is not published in the artifact;
# reconstructed as a GPT-2 with 48 layers, h=4096, 32 heads (~9.9 B parameters).
_add("gpt-10b", "gpt2", "GPT-10B", layers=48, hidden=4096, heads=32, ffn=16384, vocab=50257,
     max_positions=2048, note="reconstructed")
for _name, _l, _h, _a in (("EleutherAI/gpt-neo-125M", 12, 768, 12),
                          ("EleutherAI/gpt-neo-1.3B", 24, 2048, 16)):
    _add(_name, "gpt_neo", "GPT-Neo-" + _name.split("-")[-1], layers=_l, hidden=_h, heads=_a,
         ffn=4 * _h, vocab=50257, max_positions=2048)
# Paper Figure 7 "GPT-2.9B": gpt-neo-2.7B with 24 heads and h=2640 (head_dim 110).
_add("EleutherAI/gpt-neo-2.7B", "gpt_neo", "GPT-2.9B", layers=32, hidden=2640, heads=24,
     ffn=4 * 2640, vocab=50257, max_positions=2048)
_add("facebook/opt-125m", "opt", "OPT-125M", layers=12, hidden=768, heads=12, ffn=3072,
     vocab=50272, max_positions=2048)
_add("facebook/opt-350m", "opt", "OPT-350M", layers=24, hidden=1024, heads=16, ffn=4096,
     vocab=50272, max_positions=2048, embedding_size=512,
     extra=(("do_layer_norm_before", False),))
_add("facebook/opt-1.3b", "opt", "OPT-1.3B", layers=24, hidden=2048, heads=32, ffn=8192,
     vocab=50272, max_positions=2048)
_add("facebook/opt-2.7b", "opt", "OPT-2.7B", layers=32, hidden=2560, heads=32, ffn=10240,
     vocab=50272, max_positions=2048)
_add("llama-7b", "llama", "LLaMA-7B", layers=32, hidden=4096, heads=32, kv_heads=32, ffn=11008,
     gated_ffn=True, vocab=32000, max_positions=2048)
_add("llama-13b", "llama", "LLaMA-13B", layers=40, hidden=5120, heads=40, kv_heads=40,
     ffn=13824, gated_ffn=True, vocab=32000, max_positions=2048)

# ---- Today's families (issue 27): no hand recipe, their Slapo schedule is "auto" ----------------
# Sizes of the public checkpoints' published HF configs (text model only for Gemma 3).
_AUTO = dict(gated_ffn=True, schedule="auto")
_add("Qwen/Qwen3-8B", "qwen3", "Qwen3-8B", layers=36, hidden=4096, heads=32, kv_heads=8,
     head_dim=128, ffn=12288, vocab=151936, max_positions=40960, **_AUTO)
_add("mistralai/Mistral-7B-v0.3", "mistral", "Mistral-7B", layers=32, hidden=4096, heads=32,
     kv_heads=8, ffn=14336, vocab=32768, max_positions=32768, **_AUTO)
for _name, _l, _h, _a, _kv, _ff in (("google/gemma-3-4b-pt", 34, 2560, 8, 4, 10240),
                                    ("google/gemma-3-12b-pt", 48, 3840, 16, 8, 15360)):
    _add(_name, "gemma3", "Gemma-3-" + _name.split("-")[2].upper(), layers=_l, hidden=_h,
         heads=_a, kv_heads=_kv, head_dim=256, ffn=_ff, vocab=262208, max_positions=131072,
         extra=(("sliding_window", 1024), ("query_pre_attn_scalar", 256)), **_AUTO)
_add("microsoft/Phi-3-mini-4k-instruct", "phi3", "Phi-3-mini", layers=32, hidden=3072,
     heads=32, kv_heads=32, ffn=8192, vocab=32064, max_positions=4096, **_AUTO)
_add("mistralai/Mixtral-8x7B-v0.1", "mixtral", "Mixtral-8x7B", layers=32, hidden=4096,
     heads=32, kv_heads=8, ffn=14336, experts=8, experts_per_token=2, vocab=32000,
     max_positions=32768, **_AUTO)
_add("Qwen/Qwen3-30B-A3B", "qwen3_moe", "Qwen3-30B-A3B", layers=48, hidden=2048, heads=32,
     kv_heads=4, head_dim=128, ffn=768, experts=128, experts_per_token=8, vocab=151936,
     max_positions=40960, **_AUTO)

# ---- T5 (encoder-decoder, v1.0: ReLU FFN, tied embeddings) ------------------------------------
for _name, _l, _h, _a, _kv, _ff in (("t5-small", 6, 512, 8, 64, 2048),
                                    ("t5-base", 12, 768, 12, 64, 3072),
                                    ("t5-large", 24, 1024, 16, 64, 4096),
                                    ("t5-3b", 24, 1024, 32, 128, 16384)):
    _add(_name, "t5", {"t5-3b": "T5-2.9B"}.get(_name, _name.upper()), layers=_l,
         decoder_layers=_l, hidden=_h, heads=_a, head_dim=_kv, ffn=_ff, vocab=32128,
         max_positions=4096)  # relative position buckets: no hard limit; 4096 is a sanity bound

# ---- WideResNet (torchvision Bottleneck ResNet, 224x224 images, 1000 classes) -----------------
for _size, _w in (("250M", 128), ("1.3B", 320), ("2.4B", 448), ("3B", 512), ("4.6B", 640)):
    _add(f"wideresnet-{_size}", "wideresnet", f"WideResNet-{_size}", block_layers=(6, 8, 46, 6),
         width_per_group=_w)
_add("wide_resnet50_2", "wideresnet", "WRN-50-2", block_layers=(3, 4, 6, 3), width_per_group=128)

# ---- CPU-scale versions of the Figure 7 models (a few layers, h=512, vocab 8192) -------------
# Sized so that a sweep of end2end/configs/cpu.cfg fits ~15 minutes on 2 cores. The vocabulary is
# cut to 8192 (inputs are synthetic token ids) so the LM head does not dominate the step.
_CPU = dict(hidden=512, heads=8, ffn=2048, vocab=8192)
_add("cpu/bert", "bert", "BERT (CPU)", layers=4, max_positions=512, **_CPU)
_add("cpu/roberta", "roberta", "RoBERTa (CPU)", layers=4, max_positions=512, **_CPU)
_add("cpu/albert", "albert", "ALBERT (CPU)", layers=4, max_positions=512, embedding_size=128,
     **_CPU)
_add("cpu/gpt2", "gpt2", "GPT-2 (CPU)", layers=4, max_positions=1024, **_CPU)
_add("cpu/gpt-neo", "gpt_neo", "GPT-Neo (CPU)", layers=4, max_positions=2048, **_CPU)  # as GPT-Neo
_add("cpu/opt", "opt", "OPT (CPU)", layers=4, max_positions=1024, **_CPU)
_add("cpu/llama", "llama", "LLaMA (CPU)", layers=4, hidden=512, heads=8, kv_heads=4, ffn=1408,
     gated_ffn=True, vocab=8192, max_positions=1024)
# Today's families at cpu/llama's size; the MoE models have 8 experts of half llama's FFN and
# route each token to 2, so their active FFN is llama's; Gemma 3 slides a 256-token window.
_CPU_AUTO = dict(layers=4, hidden=512, heads=8, kv_heads=4, ffn=1408, vocab=8192,
                 max_positions=1024, **_AUTO)
_MOE = dict(ffn=704, experts=8, experts_per_token=2)
_add("cpu/qwen3", "qwen3", "Qwen3 (CPU)", **_CPU_AUTO)
_add("cpu/mistral", "mistral", "Mistral (CPU)", **_CPU_AUTO)
_add("cpu/gemma3", "gemma3", "Gemma 3 (CPU)", extra=(("sliding_window", 256),), **_CPU_AUTO)
_add("cpu/phi3", "phi3", "Phi-3 (CPU)", **{**_CPU_AUTO, "kv_heads": 8})
_add("cpu/mixtral", "mixtral", "Mixtral (CPU)", **{**_CPU_AUTO, **_MOE})
_add("cpu/qwen3-moe", "qwen3_moe", "Qwen3-MoE (CPU)", **{**_CPU_AUTO, **_MOE})
_add("cpu/t5", "t5", "T5 (CPU)", layers=2, decoder_layers=2, head_dim=64, max_positions=1024,
     **_CPU)
_add("cpu/wideresnet", "wideresnet", "WideResNet (CPU)", block_layers=(1, 1, 2, 1),
     width_per_group=64, image_size=64, num_classes=100)

# ---- tiny versions for the driver's tests (seconds per run, any sequence length <= 128) ------
_TINY = dict(layers=2, hidden=64, heads=4, ffn=128, vocab=256, max_positions=128)
for _name, _family in (("tiny/bert", "bert"), ("tiny/roberta", "roberta"),
                       ("tiny/gpt2", "gpt2"), ("tiny/gpt-neo", "gpt_neo"), ("tiny/opt", "opt")):
    _add(_name, _family, _name, **_TINY)
_add("tiny/albert", "albert", "tiny/albert", embedding_size=32, **_TINY)
_add("tiny/llama", "llama", "tiny/llama", kv_heads=2, gated_ffn=True,
     **{**_TINY, "ffn": 96})
_TINY_AUTO = dict(_TINY, kv_heads=2, ffn=96, **_AUTO)
for _name, _family in (("tiny/qwen3", "qwen3"), ("tiny/mistral", "mistral"),
                       ("tiny/gemma3", "gemma3"), ("tiny/phi3", "phi3")):
    _add(_name, _family, _name, **_TINY_AUTO)
for _name, _family in (("tiny/mixtral", "mixtral"), ("tiny/qwen3-moe", "qwen3_moe")):
    _add(_name, _family, _name, experts=4, experts_per_token=2, **{**_TINY_AUTO, "ffn": 48})
_add("tiny/t5", "t5", "tiny/t5", decoder_layers=2, head_dim=16, **_TINY)
_add("tiny/wideresnet", "wideresnet", "tiny/wideresnet", block_layers=(1, 1, 1, 1),
     width_per_group=4, image_size=32, num_classes=10)
