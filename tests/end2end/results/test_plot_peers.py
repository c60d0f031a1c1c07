"""The peers figure (``end2end.plot --peers``, issue 18): only the PyTorch peers and their Slapo
counterparts, speedups Slapo-FSDP2 / FSDP2 and Slapo-TP / DTensor-TP, from the rows only."""

from end2end.spec.config_file import expand, parse_lines
from end2end.results.plot import main, make_figure
from end2end.results.store import ResultRow, append_result, read_results
from end2end.results.summary import PEER_GROUPS, figure7_table

LINES = ["fsdp cpu/bert 2 256 0 4 0", "slapo-fsdp cpu/bert 2 256 0 4 0",
         "dtensor-tp cpu/bert 2 256 0 4 0", "slapo-megatron cpu/bert 2 256 0 4 0",
         "megatron cpu/bert 2 256 0 4 0", "deepspeed cpu/bert 2 256 0 4 0",
         "dtensor-tp cpu/wideresnet 2 1 0 16 0", "slapo-megatron cpu/wideresnet 2 1 0 16 0"]
THROUGHPUT = {"fsdp": 2.0, "slapo-fsdp": 3.0, "dtensor-tp": 4.0, "slapo-megatron": 5.0,
              "megatron": 10.0, "deepspeed": 1.0}


def _results(tmp_path):
    path = tmp_path / "peers.tsv"
    for spec in expand(parse_lines(LINES, "peers.cfg")):
        if spec.mode == "dtensor-tp" and spec.model == "cpu/wideresnet":
            row = ResultRow.from_spec(spec, "fail", error="does not support wideresnet")
        else:
            row = ResultRow.from_spec(spec, "ok", thrpt=THROUGHPUT[spec.mode], device="cpu")
        append_result(path, row, {"device": "cpu"})
    return path


def test_peers_figure_and_speedups(tmp_path, capsys):
    path = _results(tmp_path)
    assert main([str(path), "--peers", "-o", str(tmp_path / "peers")]) == 0
    out = capsys.readouterr().out
    assert "Slapo-FSDP2 / FSDP2 = 1.50x" in out and "Slapo-TP / DTensor-TP = 1.25x" in out
    assert "Megatron" not in out and "DeepSpeed" not in out  # other systems are left out
    assert (tmp_path / "peers.png").exists() and (tmp_path / "peers.pdf").exists()

    rows = [r for r in read_results(path).rows if r.impl in PEER_GROUPS[0]]
    fig = make_figure(figure7_table(rows), groups=PEER_GROUPS)
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend[:4] == ["Slapo-TP", "FSDP2", "Slapo-FSDP2", "DTensor-TP"]
    bert = fig.axes[0]
    assert sorted(t.get_text() for t in bert.texts) == ["1.25x", "1.50x"]


def test_figure7_keeps_slapo_tp_over_megatron(tmp_path):
    """With Megatron-LM in the panel, Slapo-TP's label stays its speedup over Megatron-LM."""
    rows = [r for r in read_results(_results(tmp_path)).rows if r.model == "cpu/bert"]
    fig = make_figure(figure7_table(rows))
    assert "0.50x" in [t.get_text() for t in fig.axes[0].texts]  # 5 / 10
