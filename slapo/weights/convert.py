"""Convert a directory of the older checkpoint format (``manifest.json`` and ``rank-*.pt``, what
``slapo.save_checkpoint`` wrote before it moved to DCP) into a DCP training state that
:func:`slapo.load_training_state` reads, at any layout::

    python -m slapo.weights.convert OLD_DIR NEW_DIR [--step N]

The pieces are validated as ``load_checkpoint`` validates them (manifest, coverage, sizes,
checksums), assembled into whole tensors in one process and written under ``model.<name>``; the
state has no optimizer state and no RNG states (the old format never held them).
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from typing import Dict, List, Optional

import torch
from torch import nn

from ..errors import CheckpointIOError
from .checkpoint_format import MANIFEST
from .checkpoint_io import load_checkpoint
from .training_state import FORMAT

__all__ = ["convert_checkpoint", "main"]

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool)}


def _holder(entries: Dict[str, dict]) -> nn.Module:
    """A module tree with one whole tensor per manifest entry at its name (aliases tied)."""
    root = nn.Module()

    def place(name: str, value: torch.Tensor, kind: str) -> None:
        *path, attr = name.split(".")
        mod = root
        for part in path:
            if not hasattr(mod, part):
                mod.add_module(part, nn.Module())
            mod = getattr(mod, part)
        if kind == "param":
            mod.register_parameter(attr, value)  # type: ignore[arg-type]
        else:
            mod.register_buffer(attr, value)

    for name, e in entries.items():
        dtype = _DTYPES.get(e["dtype"])
        if dtype is None:
            raise CheckpointIOError(f"'{name}' has dtype {e['dtype']}, which cannot convert",
                                    call="convert_checkpoint", hint="save it as float32")
        data = torch.zeros(e["shape"], dtype=dtype)
        value = nn.Parameter(data, requires_grad=False) if e["kind"] == "param" else data
        for n in [name, *e.get("aliases", [])]:
            place(n, value, e["kind"])
    return root


def convert_checkpoint(old_dir: str, new_dir: str, step: int = 0) -> str:
    """Convert the older-format directory ``old_dir`` into a training state in
    ``new_dir`` (one process). Returns ``new_dir``.

    Raises:
        CheckpointIOError: what ``load_checkpoint`` refuses (missing or damaged files, pieces
            that do not tile a tensor, checksum mismatches).
    """
    import torch.distributed.checkpoint as dcp

    path = os.path.join(old_dir, MANIFEST)
    try:
        with open(path) as f:
            entries = json.load(f)["tensors"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointIOError(f"no readable {MANIFEST} in '{old_dir}'",
                                call="convert_checkpoint",
                                hint="pass a directory of the older format (manifest.json "
                                "and rank-*.pt)") from exc
    holder = _holder(entries)
    load_checkpoint(holder, old_dir)  # validates everything, fills the whole tensors
    model = {name: holder.get_parameter(name) if e["kind"] == "param" else
             holder.get_buffer(name) for name, e in entries.items()}
    train = {"format": FORMAT, "step": int(step), "data_position": None, "extra": None,
             "world_size": 1, "scheduler": None, "converted_from": os.path.abspath(old_dir)}
    os.makedirs(new_dir, exist_ok=True)
    dcp.save({"model": {k: v.detach() for k, v in model.items()}, "train": pickle.dumps(train)},
             checkpoint_id=new_dir, no_dist=True)
    return new_dir


def main(argv: Optional[List[str]] = None) -> int:
    """The command line: ``python -m slapo.weights.convert OLD_DIR NEW_DIR [--step N]``."""
    parser = argparse.ArgumentParser(prog="python -m slapo.weights.convert",
                                     description=__doc__.split("::")[0].strip())
    parser.add_argument("old_dir", help="a directory of the older format (manifest.json)")
    parser.add_argument("new_dir", help="where to write the DCP training state")
    parser.add_argument("--step", type=int, default=0, help="the step to record (default 0)")
    args = parser.parse_args(argv)
    try:
        convert_checkpoint(args.old_dir, args.new_dir, step=args.step)
    except CheckpointIOError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"converted {args.old_dir} -> {args.new_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
