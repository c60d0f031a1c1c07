"""``python -m end2end.models [MODEL ...]``: the model zoo as a table (names a config line's MODEL
takes, their sizes and parameter counts counted on the meta device); with MODELs, those rows
only, shapes (``gpt2:layers=24,...``) and HF ``config.json`` paths included."""

from __future__ import annotations

from typing import List, Optional

from end2end.models.build import build_model, count_parameters, get_model_spec, list_models
from end2end.models.zoo import FAMILIES

__all__ = ["build_parser", "main"]


def _params_text(name: str) -> str:
    count = count_parameters(build_model(name, device="meta"))  # allocates nothing
    return f"{count / 1e9:.3f} B" if count >= 1e8 else f"{count / 1e6:.2f} M"


def build_parser():
    """The ``python -m end2end.models`` command line."""
    import argparse

    from end2end.cli import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="python -m end2end.models", formatter_class=HelpFormatter,
        description="List the benchmark model zoo: the names a config line's MODEL takes, "
                    "their sizes and parameter counts (built on the meta device: no memory, "
                    "no downloads).")
    parser.add_argument("models", nargs="*", metavar="MODEL",
                        help="only these models: zoo names, shapes FAMILY:key=value,... or "
                             "paths of HF config.json files (default: the whole zoo)")
    parser.add_argument("--family", choices=sorted(FAMILIES),
                        help="only this family (default: all)")
    parser.add_argument("--no-params", dest="params", action="store_false",
                        help="skip the parameter counts (builds no models; faster)")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """``python -m end2end.models``: the zoo as a table (name, family, paper label, parameters
    counted on the meta device, shape, notes)."""
    from end2end.cli import report_errors

    args = build_parser().parse_args(argv)
    return report_errors("end2end.models", lambda: _table(args), debug=False)


def _table(args) -> int:
    header = f"{'NAME':28s} {'FAMILY':10s} {'PAPER LABEL':18s} {'PARAMS':>9s}  SHAPE / NOTE"
    print(header)
    print("-" * len(header))
    for name in args.models or list_models():
        s = get_model_spec(name)
        if args.family and s.family != args.family:
            continue
        layers = f"L{s.layers}" + (f"+{s.decoder_layers}" if s.decoder_layers else "")
        shape = (f"wrn {list(s.block_layers)} w{s.width_per_group} img{s.image_size}"
                 if s.is_vision else
                 f"{layers} h{s.hidden} a{s.heads} ffn{s.ffn} V{s.vocab} pos{s.max_positions}")
        params = _params_text(name) if args.params else "-"
        print(f"{name:28s} {s.family:10s} {s.label:18s} {params:>9s}  {shape} {s.note}".rstrip())
    return 0

