"""make_runner's builder table: the driver's table lists every mode's builder (read-only), a
caller replaces builders in a copy (the simulator's modelled runtimes) and make_runner builds
with the table it is given; the driver's table is never changed."""

import pytest

from end2end.driver.runtimes import BUILDERS, default_builders, make_runner


def test_replace_makes_a_copy_and_refuses_unknown_modes():
    table = default_builders()
    assert dict(table.modes) == BUILDERS
    with pytest.raises(TypeError):
        table.modes["eager"] = None  # a read-only view

    def fake(request):
        return ("built", request.mode.name, request.tensor_parallel)

    def fake_pipeline(request, sch):
        return "pipe"

    mine = table.replace({"eager": fake}, pipeline=fake_pipeline)
    assert mine.modes["eager"] is fake and mine.pipeline is fake_pipeline
    assert BUILDERS["eager"] is not fake and default_builders().pipeline is not fake_pipeline
    with pytest.raises(ValueError, match="no mode 'eagre'"):
        table.replace({"eagre": fake})


def test_make_runner_builds_with_the_given_table():
    def fake(request):
        return ("built", request.mode.name, request.tensor_parallel)

    table = default_builders().replace({"eager": fake})
    assert make_runner("eager", "tiny/gpt2", builders=table) == ("built", "eager", 1)
