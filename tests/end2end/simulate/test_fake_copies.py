"""A deep copy made in the fake world (a schedule's history snapshots the modules given to a
primitive) shares the world's one ``FakeTensorMode``: a copied mode duplicates the storage weak
references of its converter, and each copy frees its own, a double free that corrupted the heap
in about one of ten simulations of a Slapo-scheduled ``tiny/bert`` (end2end/simulate/engine/
fake_world.py)."""

from end2end.simulate.engine.isolated import isolated

HERE = "tests.end2end.simulate.test_fake_copies"


def copy_in_a_fake_world() -> dict:
    """A linear layer and a deep copy of it, made in a 1-rank fake world: what the copy is."""
    import copy

    import torch.nn as nn

    from end2end.simulate.engine.fake_world import fake_world

    with fake_world(0, 1) as mode:
        layer = nn.Linear(8, 4)
        twin = copy.deepcopy(nn.Sequential(layer))[0]
        twin.weight.data.mul_(2)  # a copy: its own storage, its own parameter object
        return dict(same_mode=twin.weight.fake_mode is mode,
                    layer_mode=layer.weight.fake_mode is mode,
                    new_parameter=twin.weight is not layer.weight,
                    shape=list(twin.weight.shape), fake=type(twin.weight.data).__name__,
                    grad=twin.weight.requires_grad)


def test_a_deep_copy_in_the_fake_world_shares_its_mode():
    got = isolated(f"{HERE}.copy_in_a_fake_world")
    assert got == dict(same_mode=True, layer_mode=True, new_parameter=True, shape=[4, 8],
                       fake="FakeTensor", grad=True)
