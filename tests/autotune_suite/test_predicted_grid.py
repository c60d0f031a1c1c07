"""``python -m autotune.predicted_grid`` (issue 25, item 6): a whole grid predicted through the
space's ``predict`` command, then the strategies replayed on the predictions; and the paper-scale
space ``autotune/spaces/bert_paper.py`` it is made for."""

import json
import sys
import textwrap

import pytest

from autotune.predicted_grid import keep_batches, main
from end2end.results.tuning import predicted_optimum, predicted_outcomes
from slapo.autotune import Prediction
from slapo.autotune.cli import load_space_file
from slapo.errors import TuneError

# a predictor of made-up numbers: faster with the batch, slower with checkpointing, predicted
# OOM at batch >= 16 with ratio < 0.5 (so the optimum is batch 20 at ratio 0.5: 17 samples/s)
PREDICT = textwrap.dedent("""
    import json, sys
    b, r = int(sys.argv[1]), float(sys.argv[2])
    oom = b >= 16 and r < 0.5
    print(json.dumps({"status": "sim-oom" if oom else "sim", "memory_gb": b * (1 - r / 2),
                      "samples_per_s": b * (1 - 0.3 * r), "error": "over" if oom else ""}))
""")


@pytest.fixture
def space_file(tmp_path):
    (tmp_path / "predict.py").write_text(PREDICT)
    path = tmp_path / "space.py"
    path.write_text(textwrap.dedent(f"""
        import sys
        from slapo.autotune import Space
        space = Space("toy")
        space.int("batch_size", 4, 20, step=4)
        space.choice("ckpt_ratio", [0, 0.25, 0.5, 1.0])
        command = [sys.executable, "-c", "print(1)"]
        memory_budget_gb = 12.0
        predict = [sys.executable, {str(tmp_path / 'predict.py')!r}, "{{batch_size}}",
                   "{{ckpt_ratio}}"]
    """))
    return path


def test_every_candidate_is_predicted_once_and_the_search_reaches_the_predicted_optimum(
        space_file, tmp_path, capsys):
    predictions, runs = tmp_path / "p.jsonl", tmp_path / "runs.jsonl"
    argv = ["--space", str(space_file), "--predictions", str(predictions), "--simulate",
            "--seeds", "2", "--budget", "12", "--json", str(runs)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert len(predictions.read_text().splitlines()) == 20  # 5 batches x 4 ratios
    assert "predicted optimum: 17 samples/s at batch_size=20 ckpt_ratio=0.5" in out
    assert "predicted OOM: 4 of 20" in out  # 16 and 20 at ratios 0 and 0.25
    search = json.loads(runs.read_text().splitlines()[0])
    assert search["strategy"] == "search" and search["best_fraction"] == 1.0
    assert len(runs.read_text().splitlines()) == 3  # the search + 2 TPE seeds
    assert main(argv) == 0  # a second run predicts nothing again
    assert "[1/" not in capsys.readouterr().out
    assert len(predictions.read_text().splitlines()) == 20


def test_batches_keep_a_smaller_grid_and_the_optimum_moves_with_it(space_file, tmp_path, capsys):
    argv = ["--space", str(space_file), "--predictions", str(tmp_path / "p.jsonl"),
            "--simulate", "--seeds", "0", "--batches", "4,8"]
    assert main(argv) == 0
    assert "predicted optimum: 8 samples/s at batch_size=8 ckpt_ratio=0" in capsys.readouterr().out
    assert len((tmp_path / "p.jsonl").read_text().splitlines()) == 8
    space = load_space_file(str(space_file))["space"]
    with pytest.raises(TuneError, match=r"\[6\] not batch sizes of the space"):
        keep_batches(space, "4,6")
    with pytest.raises(TuneError, match="not a comma-separated list"):
        keep_batches(space, "4;8")


def test_missing_predictions_are_an_error_naming_the_fix(space_file, tmp_path, capsys):
    (tmp_path / "p.jsonl").write_text(json.dumps({
        "params": {"batch_size": 4, "ckpt_ratio": 0},
        "prediction": {"status": "sim", "memory_gb": 1.0, "samples_per_s": 2.0}}) + "\n")
    assert main(["--space", str(space_file), "--predictions", str(tmp_path / "p.jsonl")]) == 2
    assert "19 candidate(s) have no prediction" in capsys.readouterr().err


def test_outcomes_read_predictions_as_runs_and_ooms():
    outcomes = predicted_outcomes({
        "a": Prediction("sim", 1.0, 5.0), "b": Prediction("sim-oom", 40.0, 9.0, "over"),
        "c": Prediction("fail", error="invalid")})
    assert outcomes["a"] == {"status": "ok", "throughput": 5.0, "memory_gb": 1.0}
    assert outcomes["b"]["status"] == "oom" and outcomes["c"]["status"] == "fail"
    assert predicted_optimum(outcomes)[0] == "a"  # the faster sim-oom one does not count
    with pytest.raises(TuneError, match="no candidate is predicted to fit"):
        predicted_optimum({"b": outcomes["b"]})


def test_the_paper_space_is_figure_10s_grid_predicted_on_the_paper_gpu():
    ns = load_space_file("autotune/spaces/bert_paper.py")
    space = ns["space"]
    assert len(space.candidates()) == 88  # batch 8..28 step 2 x 8 ratios
    assert space.symbols["batch_size"].values == tuple(range(8, 29, 2))
    # the peak a 32 GiB V100 holds after the profile's allocator overhead and reserve (in GB)
    assert ns["memory_budget_gb"] == pytest.approx((32 * 2**30 / 1e9 - 1) / 1.1, abs=1e-3)
    line = ns["predictor"].describe(space.complete({"batch_size": 18, "ckpt_ratio": 0.25}))
    assert line.startswith(sys.executable)
    for part in ("end2end.simulate.one", "--model bert-xlarge", "--gpus 8", "--seq-len 512",
                 "--batch-size 18", "--ckpt 0.25", "--dtype fp16", "--device v100-32gb"):
        assert part in line
    assert "autotune.driver" in " ".join(ns["command"])  # the real run on GPUs
