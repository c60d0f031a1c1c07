"""Which bar a row is and what its legend says: knobs and pipelines are systems of their own,
and a DeepSpeed pipeline is not labelled ZeRO-3."""

from end2end.results.store import ResultRow
from end2end.results.summary import baselines_of, label_of, system_of


def _row(impl, pp=None, knobs=""):
    return ResultRow(impl=impl, model="tiny/bert", seq=16, dec_seq=0, ngpu=2, batch=2, ckpt="0",
                     pp=pp, knobs=knobs)


def test_a_pipeline_is_a_system_of_its_own_and_deepspeed_pipelines_are_not_zero3():
    assert system_of(_row("slapo-deepspeed")) == "slapo-deepspeed"
    assert label_of(system_of(_row("slapo-deepspeed"))) == "Slapo-ZeRO3"
    assert system_of(_row("slapo-deepspeed", pp=1)) == "slapo-deepspeed"
    piped = system_of(_row("slapo-deepspeed", pp=2))
    assert piped == "slapo-deepspeed [pp=2]" and label_of(piped) == "Slapo-DeepSpeed [pp=2]"
    both = system_of(_row("slapo", pp=2, knobs="fuse_bias_gelu=True"))
    assert both == "slapo [pp=2,fuse_bias_gelu=True]"
    assert label_of(both) == "Slapo [pp=2,fuse_bias_gelu=True]"
    assert baselines_of(both) == ["eager"]  # compared with data parallelism on the same ranks
