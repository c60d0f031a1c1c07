"""The files of a HuggingFace (Hub-format) checkpoint directory, read without loading a tensor.

A directory that ``from_pretrained`` loads holds ``model.safetensors``, or several
``model-0000i-of-0000n.safetensors`` shards and ``model.safetensors.index.json`` (its
``weight_map`` names the shard of every tensor). A safetensors file is an 8-byte little-endian
header length, a JSON header (per tensor: dtype, shape, byte offsets) and the bytes. Reading the
headers gives every tensor's dtype and shape and lets a truncated or inconsistent file be refused
before any tensor is read; the tensors themselves are read later, slice by slice
(``safe_open(...).get_slice``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from typing import Dict, List

import torch

from ..errors import CheckpointIOError

__all__ = ["StoredTensor", "read_hub_directory", "SAFE_DTYPES", "INDEX", "SINGLE"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CALL = "load_pretrained"

SAFE_DTYPES: Dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    """One tensor of the checkpoint: its key, the file holding it, dtype and shape."""

    key: str
    file: str  # absolute path
    dtype: torch.dtype
    shape: tuple

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= int(s)
        return n


def _fail(what: str, hint: str) -> CheckpointIOError:
    return CheckpointIOError(what, call=CALL, hint=hint)


def _read_header(path: str) -> Dict[str, StoredTensor]:
    """The tensors a safetensors file declares, after checking the file is complete."""
    name = os.path.basename(path)
    size = os.path.getsize(path)
    damaged = "the file is damaged or was cut short: download or save it again"
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise _fail(f"'{name}' has {size} bytes, too few for a safetensors header",
                            damaged)
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                raise _fail(f"'{name}' is truncated: its header says {length} header bytes but "
                            f"the file has {size}", damaged)
            header = json.loads(f.read(length))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise _fail(f"'{name}' is not a readable safetensors file ({exc})", damaged) from exc
    if not isinstance(header, dict):
        raise _fail(f"'{name}' has a malformed safetensors header", damaged)
    out: Dict[str, StoredTensor] = {}
    end = 0
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            code, shape, (lo, hi) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise _fail(f"'{name}': the header entry of '{key}' is malformed", damaged) from exc
        if code not in SAFE_DTYPES:
            raise _fail(f"'{name}': tensor '{key}' has dtype {code}, which slapo cannot load",
                        "convert the checkpoint to F32, F16 or BF16 (e.g. save_pretrained after "
                        "dequantising)")
        t = StoredTensor(key, path, SAFE_DTYPES[code], shape)
        nbytes = t.numel * SAFE_DTYPES[code].itemsize
        if hi - lo != nbytes:
            raise _fail(f"'{name}': tensor '{key}' is declared {code}{list(shape)} "
                        f"({nbytes} bytes) but holds {hi - lo} bytes (mismatched dtype or shape)",
                        damaged)
        out[key] = t
        end = max(end, hi)
    if size < 8 + length + end:
        raise _fail(f"'{name}' is truncated: it has {size} bytes but its header needs "
                    f"{8 + length + end}", damaged)
    return out


def _shard_files(directory: str) -> Dict[str, List[str]]:
    """``{file name: [keys the index assigns to it]}`` (``None`` lists: take the file's own)."""
    index_path = os.path.join(directory, INDEX)
    if os.path.isfile(index_path):
        try:
            with open(index_path) as f:
                weight_map = json.load(f)["weight_map"]
            assert isinstance(weight_map, dict)
        except (OSError, ValueError, KeyError, TypeError, AssertionError) as exc:
            raise _fail(f"'{INDEX}' in '{directory}' is unreadable or has no weight_map",
                        "write the index again (save_pretrained does)") from exc
        files: Dict[str, List[str]] = {}
        for key, fname in weight_map.items():
            files.setdefault(str(fname), []).append(str(key))
        for fname in sorted(files):
            if not os.path.isfile(os.path.join(directory, fname)):
                raise _fail(f"shard '{fname}' named by {INDEX} is missing from '{directory}' "
                            f"({len(files[fname])} tensors)",
                            "copy every shard the index lists into the directory")
        return files
    found = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    if not found:
        others = [f for f in os.listdir(directory) if f.endswith((".bin", ".pt", ".pth"))]
        extra = (f" (found {others[0]}: only safetensors are read; convert it with "
                 "save_pretrained(..., safe_serialization=True))" if others else "")
        raise _fail(f"no *.safetensors file in '{directory}'{extra}",
                    "pass a directory written by save_pretrained or slapo.export_pretrained")
    if SINGLE in found:
        found = [SINGLE]
    return {f: [] for f in found}


def read_hub_directory(directory: str) -> Dict[str, StoredTensor]:
    """Every tensor of the checkpoint in ``directory`` by key, checked for completeness.

    Raises:
        CheckpointIOError: not a directory, no safetensors file, an unreadable index, a shard the
            index names that is missing, a truncated file, a header whose dtype and byte size
            disagree, or a key the index assigns to a file that lacks it.
    """
    if not os.path.isdir(directory):
        raise _fail(f"'{directory}' is not a directory",
                    "pass the directory holding model.safetensors (or its shards and index)")
    out: Dict[str, StoredTensor] = {}
    for fname, keys in _shard_files(directory).items():
        declared = _read_header(os.path.join(directory, fname))
        for key in keys:
            if key not in declared:
                raise _fail(f"{INDEX} puts '{key}' in '{fname}', which does not hold it",
                            "write the index again (save_pretrained does)")
        for key in keys or list(declared):
            out[key] = declared[key]
    return out
