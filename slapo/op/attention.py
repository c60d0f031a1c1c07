"""Core attention on ``[B, H, S, D]`` tensors, built on ``F.scaled_dot_product_attention``.

Three pieces:

* :func:`attention` — the fast op: causal and/or windowed (local) structure, a padding or bias
  mask, grouped-query attention (GQA), dropout, a scale, and an explicit kernel choice.
* :func:`attention_reference` — the same maths written as matmul-softmax-matmul; tests compare
  the fast op against it.
* :class:`AttentionOp` — the module form, whose dropout is active only in ``training`` mode (the
  original implementation applied it in eval too; reference-spec §9.10).

Masks. ``attn_mask`` is anything SDPA broadcasts to ``[B, H, Q, K]``: a **bool** mask where
``True`` means "may attend", or a **floating** mask that is added to the scores (HF's eager
"additive" masks, T5's position bias). A HF-style ``[B, K]`` 0/1 padding mask is converted with
:func:`padding_mask`. ``causal`` and ``window_size`` are applied *in addition* to ``attn_mask``
(applying a causal structure to a mask that already contains it changes nothing). Causal masks
are aligned to the bottom-right: query ``i`` of ``Q`` sits at absolute position ``K - Q + i``,
which is what a KV cache needs; for ``Q == K`` this is the usual lower triangle. A local window
of size ``w`` lets query position ``p`` see keys ``p - w < j <= p`` (GPT-Neo's local layers).
Local attention over ``S >= 2w`` tokens without a user mask runs block by block (blocks of
``w`` queries against ``2w`` keys, ``~2Sw`` scores instead of ``S^2``); a window covering every
key is plain causal attention (the kernels' fast causal path).

Kernels (``backend``). ``"auto"`` lets torch pick (on CPU its CPU flash or math kernel; with
dropout on the CPU, where only the math kernel takes dropout, the same maths with the cheap
dropout mask of :mod:`slapo.op.dropout`);
``"math"``, ``"flash"``, ``"efficient"`` and ``"cudnn"`` force one via
``torch.nn.attention.sdpa_kernel``. Decision: an explicit request is honoured or refused — never
silently downgraded. ``"efficient"``/``"cudnn"`` on a non-CUDA tensor and any kernel that torch
cannot run with the given inputs (e.g. the flash kernel with a float mask or, on CPU, dropout)
raise :class:`~slapo.errors.OpError` naming the constraint; masks are never dropped to make a
kernel fit (the original silently ignored them; §9.10). Use ``"auto"`` for "fastest that works".

The CPU kernel of ``"auto"`` with dropout can be swapped for the scope of a ``with`` block:
:func:`cpu_dropout_kernel` (e.g. a simulator whose fake tensors live on the CPU but stand for a
GPU's selects the fused kernel a GPU would run). It is the only kernel choice made outside the
call, and it is made through this public context, never by rebinding this module's names.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import OpError

__all__ = [
    "BACKENDS", "attention", "attention_reference", "AttentionOp", "padding_mask",
    "structure_mask", "repeat_kv", "check_backend", "cpu_dropout_kernel",
]

BACKENDS = ("auto", "math", "flash", "efficient", "cudnn")
_GPU_ONLY = ("efficient", "cudnn")


def check_backend(backend: str, call: str = "attention") -> str:
    """Validate a backend name (see :data:`BACKENDS`); returns it."""
    if backend not in BACKENDS:
        raise OpError(f"unknown attention backend {backend!r}", call=call,
                      hint=f"choose one of {', '.join(BACKENDS)}")
    return backend


SdpaKernel = Callable[..., torch.Tensor]
_CPU_DROPOUT_KERNELS: List[SdpaKernel] = []  # innermost last (cpu_dropout_kernel)


@contextlib.contextmanager
def cpu_dropout_kernel(kernel: SdpaKernel) -> Iterator[SdpaKernel]:
    """Within: :func:`attention` with ``backend="auto"`` and dropout on a CPU tensor calls
    ``kernel(q, k, v, attn_mask=, dropout_p=, is_causal=, scale=)`` (the signature of
    ``F.scaled_dot_product_attention``; ``k``/``v`` may have fewer heads than ``q``) instead of
    the math kernel with the cheap dropout mask. Contexts nest (the innermost wins); the choice
    is process-wide (not per thread), so it also holds in a backward's recomputation of a
    checkpointed layer. Yields ``kernel``."""
    if not callable(kernel):
        raise OpError(f"cpu_dropout_kernel takes a function, got {type(kernel).__name__}",
                      call="cpu_dropout_kernel",
                      hint="pass an SDPA-compatible function fn(q, k, v, attn_mask=, "
                           "dropout_p=, is_causal=, scale=)")
    _CPU_DROPOUT_KERNELS.append(kernel)
    try:
        yield kernel
    finally:
        _CPU_DROPOUT_KERNELS.remove(kernel)


def _sdpa_backend(backend: str):
    from torch.nn.attention import SDPBackend

    return {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]


def padding_mask(mask: torch.Tensor) -> torch.Tensor:
    """A HF-style ``[B, K]`` padding mask (1/True = token, 0/False = padding) as a bool
    ``[B, 1, 1, K]`` attention mask (True = may attend)."""
    if mask.dim() != 2:
        raise OpError(f"expected a [batch, key_len] padding mask, got shape {tuple(mask.shape)}",
                      call="padding_mask", hint="pass the tokenizer's attention_mask")
    return mask.bool()[:, None, None, :]


def structure_mask(q_len: int, k_len: int, *, causal: bool, window_size: Optional[int],
                   device: torch.device) -> Optional[torch.Tensor]:
    """The bool ``[Q, K]`` causal / local-window mask (True = may attend), bottom-right aligned;
    ``None`` when there is no structure."""
    if not causal and window_size is None:
        return None
    q_pos = torch.arange(k_len - q_len, k_len, device=device)[:, None]
    dist = q_pos - torch.arange(k_len, device=device)[None, :]  # how far back the key is
    allowed = dist >= 0
    if window_size is not None:
        allowed = allowed & (dist < window_size)
    return allowed


def repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[B, Hkv, S, D] -> [B, Hkv * groups, S, D]``: query head ``h`` uses kv head
    ``h // groups`` (the convention of SDPA's ``enable_gqa`` and of HF)."""
    if groups == 1:
        return x
    b, h, s, d = x.shape
    return x[:, :, None].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


def _merge(attn_mask: Optional[torch.Tensor], struct: Optional[torch.Tensor],
           dtype: torch.dtype) -> Optional[torch.Tensor]:
    """One SDPA mask from a user mask and a structural bool mask."""
    if attn_mask is not None:
        if attn_mask.dtype != torch.bool and not attn_mask.is_floating_point():
            raise OpError(
                f"attn_mask has dtype {attn_mask.dtype}; expected bool (True = may attend) or a "
                "floating additive mask", call="attention",
                hint="convert a [batch, key_len] 0/1 padding mask with slapo.op.padding_mask(mask)")
        if attn_mask.is_floating_point() and attn_mask.dtype != dtype:
            attn_mask = attn_mask.to(dtype).clamp(min=torch.finfo(dtype).min)
    if struct is None:
        return attn_mask
    if attn_mask is None:
        return struct
    if attn_mask.dtype == torch.bool:
        return attn_mask & struct
    return torch.where(struct, attn_mask, torch.finfo(attn_mask.dtype).min)


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, call: str) -> int:
    """Validate ``[B, H, S, D]`` shapes; returns the number of query heads per kv head."""
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise OpError(f"expected 4-D [batch, heads, seq, head_dim] q/k/v, got shapes "
                      f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}", call=call,
                      hint="split heads first: x.view(B, S, H, D).transpose(1, 2)")
    hq, hkv = q.shape[1], k.shape[1]
    if v.shape[1] != hkv or hkv == 0 or hq % hkv:
        raise OpError(f"{hq} query heads cannot be grouped over {hkv} key / {v.shape[1]} value "
                      "heads", call=call,
                      hint="key and value need the same number of heads, dividing the query heads")
    return hq // hkv


def _check_dropout(p: float, call: str) -> None:
    if not 0.0 <= p <= 1.0:
        raise OpError(f"dropout probability {p} is outside [0, 1]", call=call)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    *,
    causal: bool = False,
    window_size: Optional[int] = None,
    scale: Optional[float] = None,
    dropout_p: float = 0.0,
    backend: str = "auto",
    enable_gqa: Optional[bool] = None,
) -> torch.Tensor:
    """Scaled dot-product attention of ``q [B, H, Q, D]`` over ``k, v [B, Hkv, K, D]``.

    Args:
        attn_mask: bool (True = attend) or additive float mask broadcastable to ``[B, H, Q, K]``.
        causal: hide keys after each query (bottom-right aligned, see the module docs).
        window_size: local attention, each query sees only the last ``window_size`` positions
            (itself included); requires ``causal=True``.
        scale: score scale; ``None`` = ``1/sqrt(D)`` (GPT-Neo and T5 use ``1.0``).
        dropout_p: attention-probability dropout, applied as given (the caller decides whether
            it is training; :class:`AttentionOp` does that).
        backend: one of :data:`BACKENDS`.
        enable_gqa: with fewer kv heads, let SDPA broadcast them (``True``) or repeat them
            (``False``); ``None`` uses SDPA's native GQA when no mask is needed (the kernels that
            take masks on GPU mostly lack it) and the kernel is not ``"efficient"``.

    Returns ``[B, H, Q, Dv]`` in ``q``'s dtype.
    """
    call = "attention"
    check_backend(backend, call)
    groups = _check_shapes(q, k, v, call)
    _check_dropout(dropout_p, call)
    if window_size is not None and (not causal or window_size < 1):
        raise OpError(f"window_size={window_size} needs causal=True and a size >= 1", call=call,
                      hint="local attention is causal (GPT-Neo); pass causal=True")
    if backend in _GPU_ONLY and q.device.type != "cuda":
        raise OpError(f"the '{backend}' attention kernel runs on CUDA only; the inputs are on "
                      f"{q.device}", call=call,
                      hint="use backend='auto' (or 'math') off the GPU")
    q_len, k_len = q.shape[-2], k.shape[-2]
    if window_size is not None and window_size >= k_len:
        window_size = None  # the window covers every key: plain causal attention
    if _use_blocked_local(q_len, k_len, window_size, attn_mask):
        return _blocked_local_attention(q, k, v, groups, window_size, scale, dropout_p,
                                        backend, call)
    is_causal = causal and window_size is None and attn_mask is None and q_len == k_len
    struct = None if is_causal else structure_mask(q_len, k_len, causal=causal,
                                                   window_size=window_size, device=q.device)
    mask = _merge(attn_mask, struct, q.dtype)
    kwargs = {}
    if groups > 1:
        native = enable_gqa if enable_gqa is not None else (mask is None
                                                            and backend != "efficient")
        if native:
            kwargs["enable_gqa"] = True
        else:
            k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    return _sdpa(q, k, v, mask, is_causal, scale, dropout_p, backend, call, **kwargs)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
          is_causal: bool, scale: Optional[float], dropout_p: float, backend: str, call: str,
          **kwargs: bool) -> torch.Tensor:
    """One SDPA call on the requested kernel; a kernel that cannot run the inputs is an
    :class:`OpError` naming them (never a silent fallback)."""
    if dropout_p > 0 and backend == "auto" and q.device.type == "cpu":
        if _CPU_DROPOUT_KERNELS:
            return _CPU_DROPOUT_KERNELS[-1](q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                            is_causal=is_causal, scale=scale)
        return _cpu_math_with_dropout(q, k, v, mask, is_causal, scale, dropout_p)
    try:
        if backend == "auto":
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, **kwargs)
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(_sdpa_backend(backend)):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                                  is_causal=is_causal, scale=scale, **kwargs)
    except RuntimeError as err:
        text = str(err)
        if "No available kernel" not in text and "No viable backend" not in text:
            raise
        raise OpError(
            f"the '{backend}' attention kernel cannot run these inputs on {q.device} "
            f"(dtype {q.dtype}, head_dim {q.shape[-1]}, mask "
            f"{'none' if mask is None else mask.dtype}, dropout {dropout_p}, gqa "
            f"{'native' if kwargs else 'no'}); torch's warnings above say which constraint failed",
            call=call,
            hint="use backend='auto', or remove what the kernel does not support (the flash "
            "kernel takes no float mask, and on CPU no dropout)",
        ) from err


def _use_blocked_local(q_len: int, k_len: int, window_size: Optional[int],
                       attn_mask: Optional[torch.Tensor]) -> bool:
    """Local attention over a sequence of at least two windows, without a user mask (a padding
    mask would differ per block; those calls take the band-mask path)."""
    return (window_size is not None and attn_mask is None and q_len == k_len
            and q_len >= 2 * window_size)


def _blocked_local_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int,
                             w: int, scale: Optional[float], dropout_p: float, backend: str,
                             call: str) -> torch.Tensor:
    """Causal local attention with window ``w`` computed block by block: the sequence is cut
    into blocks of ``w`` queries (padded at the end to a multiple of ``w``); block ``c`` attends
    only to the ``2w`` keys of blocks ``c-1`` and ``c``, under one ``[w, 2w]`` band mask shared
    by every block, and block 0 is plain causal attention. That is ``~2 S w`` scores instead
    of the band mask's ``S^2``, with the same result (padded queries are dropped; padded keys
    lie after every real query, so causality hides them)."""
    b, h, s, d = q.shape
    k, v = repeat_kv(k, groups), repeat_kv(v, groups)
    n = -(-s // w)
    if n * w != s:
        q, k, v = (F.pad(t, (0, 0, 0, n * w - s)) for t in (q, k, v))
    first = _sdpa(q[:, :, :w], k[:, :, :w], v[:, :, :w], None, True, scale, dropout_p,
                  backend, call)

    def pairs(t: torch.Tensor) -> torch.Tensor:  # [B, H, S, D] -> [B, H*(n-1), 2w, D]
        blocks = t.view(b, h, n, w, t.shape[-1])
        return torch.cat([blocks[:, :, :-1], blocks[:, :, 1:]], dim=3).reshape(
            b, h * (n - 1), 2 * w, t.shape[-1])

    i = torch.arange(w, device=q.device)[:, None]
    j = torch.arange(2 * w, device=q.device)[None, :]
    band = (j > i) & (j <= i + w)  # key c*w - w + j is within the window of query c*w + i
    rest_q = q[:, :, w:].reshape(b, h * (n - 1), w, d)
    rest = _sdpa(rest_q, pairs(k), pairs(v), band, False, scale, dropout_p, backend, call)
    # reshape, not view: a fused CUDA kernel returns its output in [B, L, H, D] memory order
    out = torch.cat([first, rest.reshape(b, h, (n - 1) * w, -1)], dim=2)
    return out[:, :, :s]


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: Optional[torch.Tensor] = None,
    *,
    causal: bool = False,
    window_size: Optional[int] = None,
    scale: Optional[float] = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """Eager matmul-softmax-matmul with exactly :func:`attention`'s semantics (the test oracle).

    Masked scores are set to the dtype's most negative value rather than ``-inf``, so a row with
    every key masked averages all values here while SDPA returns zeros; no correct model has such
    rows for real tokens.
    """
    groups = _check_shapes(q, k, v, "attention_reference")
    struct = structure_mask(q.shape[-2], k.shape[-2], causal=causal, window_size=window_size,
                            device=q.device)
    return _math(q, repeat_kv(k, groups), repeat_kv(v, groups), _merge(attn_mask, struct, q.dtype),
                 scale, dropout_p, F.dropout)


def _math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor],
          scale: Optional[float], dropout_p: float, drop) -> torch.Tensor:
    """matmul-softmax-(``drop``)-matmul over equal head counts; masked scores are the dtype's
    most negative value."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask is not None:
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        else:
            scores = scores + mask
    probs = torch.softmax(scores, dim=-1)
    if dropout_p > 0:
        probs = drop(probs, p=dropout_p, training=True)
    return torch.matmul(probs, v)


def _cpu_math_with_dropout(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           mask: Optional[torch.Tensor], is_causal: bool, scale: Optional[float],
                           dropout_p: float) -> torch.Tensor:
    """What SDPA runs on the CPU with dropout (its math kernel: no CPU flash kernel takes
    dropout), with the cheap dropout mask of :mod:`slapo.op.dropout` instead of a float
    Bernoulli sample per score."""
    from .dropout import dropout

    groups = q.shape[1] // k.shape[1]
    if is_causal:
        mask = structure_mask(q.shape[-2], k.shape[-2], causal=True, window_size=None,
                              device=q.device)
    return _math(q, repeat_kv(k, groups), repeat_kv(v, groups), mask, scale, dropout_p, dropout)


class AttentionOp(nn.Module):
    """:func:`attention` as a module: fixed structure, scale, kernel and dropout probability.

    Dropout is applied only in ``training`` mode. The module holds no parameters, so tensor
    parallelism needs nothing here beyond an RNG fork for dropout (``fork_rng``).
    """

    def __init__(self, *, causal: bool = False, dropout: float = 0.0,
                 scale: Optional[float] = None, window_size: Optional[int] = None,
                 backend: str = "auto", enable_gqa: Optional[bool] = None):
        super().__init__()
        check_backend(backend, "AttentionOp")
        _check_dropout(dropout, "AttentionOp")
        if window_size is not None and (not causal or window_size < 1):
            raise OpError(f"window_size={window_size} needs causal=True and a size >= 1",
                          call="AttentionOp", hint="local attention is causal; pass causal=True")
        self.causal = causal
        self.dropout = float(dropout)
        self.scale = scale
        self.window_size = window_size
        self.backend = backend
        self.enable_gqa = enable_gqa

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                attn_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        return attention(q, k, v, attn_mask, causal=self.causal, window_size=self.window_size,
                         scale=self.scale, dropout_p=self.dropout if self.training else 0.0,
                         backend=self.backend, enable_gqa=self.enable_gqa)

    def extra_repr(self) -> str:
        parts = [f"causal={self.causal}", f"dropout={self.dropout}", f"backend={self.backend!r}"]
        if self.scale is not None:
            parts.append(f"scale={self.scale}")
        if self.window_size is not None:
            parts.append(f"window_size={self.window_size}")
        return ", ".join(parts)
