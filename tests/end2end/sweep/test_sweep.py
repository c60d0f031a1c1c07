"""Sweep helpers: progress/ETA, launch commands, skipped rows (no driver needed)."""

import io

from end2end.spec.config_file import expand, parse_lines
from end2end.sweep.commands import deepspeed_command, single_node_command, torchrun_node_command
from end2end.sweep.multi_node import main as multi_node_main
from end2end.sweep.progress import Progress, format_duration
from end2end.results.store import read_results
from end2end.sweep.single_node import run_sweep

from .processes import free_port


def test_progress_lines_and_eta():
    now = [0.0]
    out = io.StringIO()
    p = Progress(3, stream=out, clock=lambda: now[0])
    assert p.start("slapo-deepspeed cpu/gpt-neo n=2 bs=4") == (
        "[1/3] slapo-deepspeed cpu/gpt-neo n=2 bs=4 ... ETA ?")
    now[0] += 100
    p.finish("ok")
    assert p.start("b").endswith("ETA 3m")  # 2 runs left x 100 s
    assert format_duration(3900) == "1h05m" and format_duration(42) == "42s"


def test_commands():
    (spec,) = expand(parse_lines(["#@ steps=5", "slapo-megatron gpt-10b 16 1024 0 256 0.5"]))
    cmd = single_node_command(spec, "r.tsv")
    assert cmd[:3] == ["torchrun", "--standalone", "--nproc_per_node=16"]
    assert cmd[3:5] == ["-m", "end2end.bench"] and cmd[-2:] == ["--results", "r.tsv"]
    assert "--steps" in cmd and "--ckpt" in cmd
    node = torchrun_node_command(spec, "r.tsv", 2, 8, "host0")
    assert "--rdzv_endpoint=host0:29500" in node and "--nnodes=2" in node
    ds = deepspeed_command(spec, "r.tsv", "hosts", 2, 8, "host0")
    assert ds[:3] == ["deepspeed", "--hostfile=hosts", "--num_nodes=2"] and "--module" in ds


def test_multi_node_dry_run(capsys):
    assert multi_node_main(["--hosts", "a,b", "--only-n", "16", "--dry-run",
                            "--results", "/nonexistent/fig8.tsv"]) == 0
    out = capsys.readouterr().out
    assert "ssh -tt -o BatchMode=yes a " in out and "ssh -tt -o BatchMode=yes b " in out
    assert "&& exec " in out and "--nnodes=2" in out
    assert "--model llama-7b" in out and "--model gpt-10b" in out and "n=32" not in out


def test_runs_needing_more_devices_become_skipped_rows(tmp_path, capsys):
    cfg = tmp_path / "c.cfg"
    cfg.write_text("slapo cpu/bert 4 128 0 4 0\n")
    res = tmp_path / "r.tsv"
    assert run_sweep(str(cfg), str(res), max_devices=2) == 1
    (row,) = read_results(res).rows
    assert row.status == "skipped" and "needs 4 devices" in row.error
    # resumed: nothing left to run, but the run is still not ok (exit status 1)
    assert run_sweep(str(cfg), str(res), max_devices=2) == 1
    out = capsys.readouterr().out
    assert "0 to run" in out and "1 of 1 runs not ok: 1 skipped" in out


def test_skipped_runs_run_again_once_enough_devices_are_there(tmp_path, capsys):
    cfg = tmp_path / "c.cfg"
    cfg.write_text("slapo cpu/bert 4 128 0 4 0\n")
    res = tmp_path / "r.tsv"
    assert run_sweep(str(cfg), str(res), max_devices=2) == 1
    capsys.readouterr()
    run_sweep(str(cfg), str(res), max_devices=4, dry_run=True)  # the reason is gone
    assert "--nproc_per_node=4" in capsys.readouterr().out


def test_two_local_nodes_run_for_real(tmp_path, capsys):
    """The multi-node path end to end on this machine: two torchrun agents ("nodes" named
    localhost, one gloo rank each, c10d rendezvous hosted by the first) run each line once."""
    from pathlib import Path

    port = free_port()
    cfg = tmp_path / "nodes.cfg"
    cfg.write_text("#@ steps=2 warmup=1\nslapo tiny/bert 2 16 0 4 0\neager tiny/bert 2 16 0 4 0\n")
    res = tmp_path / "nodes.tsv"
    root = str(Path(__file__).resolve().parents[3])
    argv = ["--hosts", "localhost,localhost", "--gpus-per-node", "1", "--device", "cpu",
            "--config", str(cfg), "--results", str(res), "--port", str(port), "--workdir", root]
    status = multi_node_main(argv)
    assert status == 0, [(r.impl, r.status, r.error) for r in read_results(res).rows]
    out = capsys.readouterr().out
    assert out.count("--rdzv_conf=is_host=1") == 2 and out.count("--rdzv_conf=is_host=0") == 2
    assert "ssh" not in out
    rows = read_results(res).rows
    assert [(r.impl, r.status, r.world) for r in rows] == [("slapo", "ok", 2), ("eager", "ok", 2)]
    assert (rows[0].tp, rows[1].dp) == (2, 2)  # TP across the two nodes; DP for eager
    assert multi_node_main(argv) == 0  # resumed: nothing left to run
