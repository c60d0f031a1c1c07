"""A model's name with one of its sizes changed: the planner's reduced-depth copies
(``layers``) and longer sequences (``max_positions``), as a name the driver reads.

A zoo name becomes a shape on that name (``llama-7b`` -> ``llama-7b:layers=4``); a shape gets
the key replaced or appended (``llama:hidden=512`` -> ``llama:hidden=512,layers=4``); an HF
``config.json`` is copied with the HF key changed into ``folder`` (the planner's cache) and the
copy's path is the new name. :func:`with_size` returns ``None`` when the model has no such
size to change (WideResNet, a ``config.json`` without the key).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

from end2end.models import get_model_spec
from end2end.models.shaped import is_shaped, valid_keys

__all__ = ["with_size", "HF_KEYS"]

#: The HF ``config.json`` key of each size the planner changes (the first one present wins).
HF_KEYS = {"layers": ("num_hidden_layers", "n_layer", "num_layers"),
           "max_positions": ("max_position_embeddings", "n_positions")}


def _json_copy(model: str, key: str, value: int, folder: Path) -> Optional[str]:
    path = Path(model)
    path = path / "config.json" if path.is_dir() else path
    data = json.loads(path.read_text(encoding="utf-8"))
    names = [k for k in HF_KEYS[key] if k in data]
    if not names:
        return None
    data[names[0]] = value
    if key == "layers" and "num_decoder_layers" in data:  # T5: both stacks alike
        data["num_decoder_layers"] = value
    text = json.dumps(data, sort_keys=True)
    out = folder / "models" / hashlib.sha256(text.encode()).hexdigest()[:16] / "config.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    return str(out)


def with_size(model: str, key: str, value: int, folder: Path) -> Optional[str]:
    """``model`` with its size ``key`` (``layers`` or ``max_positions``) set to ``value``
    (module docstring); ``None`` when the model has no such size."""
    spec = get_model_spec(model)
    if key not in valid_keys(spec.family):
        return None
    if not is_shaped(model):  # a zoo name (its canonical spelling)
        return f"{spec.name}:{key}={value}"
    if ":" in model and not model.endswith(".json"):
        prefix, _, body = model.partition(":")
        items = [i.strip() for i in body.split(",") if i.strip()]
        kept = [i for i in items if i.partition("=")[0].strip() != key]
        if key == "layers":  # T5's decoder follows the encoder unless written
            kept = [i for i in kept if i.partition("=")[0].strip() != "decoder_layers"]
        return f"{prefix}:{','.join(kept + [f'{key}={value}'])}"
    return _json_copy(model, key, value, folder)
