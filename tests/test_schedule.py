import pytest
from torch import nn

import slapo
from slapo.testing import MLP, tiny_model


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_paths_match_named_modules(family):
    model = tiny_model(family)
    sch = slapo.create_schedule(model)
    assert [n for n, _ in sch.named_schedules()] == [n for n, _ in model.named_modules()]
    for name, mod in model.named_modules():
        assert name in sch
        node = sch[name]
        assert node.mod is mod
        assert node.path == name
    assert sch.world_size == 1 and sch.rank == 0 and sch.group is None


def test_tree_navigation():
    model = tiny_model("bert")
    sch = slapo.create_schedule(model)
    layer = sch["bert.encoder.layer.0"]
    assert layer.parent.path == "bert.encoder.layer"
    assert layer.parent.parent is sch["bert.encoder"]
    assert list(layer.child) == [n for n, _ in layer.mod.named_children()]
    assert sch["bert"]["encoder"]["layer"]["1"] is sch["bert.encoder.layer.1"]
    assert layer.root is sch
    assert sch[""] is sch
    # nodes are stable: looking up twice gives the same node (and its metadata)
    assert sch["bert.encoder.layer.0.attention"] is sch["bert.encoder.layer.0.attention"]


def test_sequential_and_modulelist():
    model = nn.Sequential(nn.Linear(4, 4), nn.Sequential(nn.ReLU(), nn.Linear(4, 2)))
    sch = slapo.create_schedule(model)
    assert isinstance(sch["1.1"].mod, nn.Linear)
    assert "1.0" in sch and "1.2" not in sch
    with pytest.raises(slapo.PathError, match=r"'1\.2'.*no submodule '2'"):
        sch["1.2"]


def test_unknown_path_suggests_closest():
    sch = slapo.create_schedule(tiny_model("gpt2"))
    with pytest.raises(slapo.PathError) as info:
        sch["transformer.h.0.atn"]
    msg = str(info.value)
    assert "'transformer.h.0.atn'" in msg and "Hint: did you mean" in msg
    assert "'transformer.h.0.attn'" in msg
    assert "transformer.h.1" not in msg  # suggestions stay under the part of the path that exists
    assert isinstance(info.value, LookupError)
    with pytest.raises(slapo.PathError, match=r"did you mean 'transformer\.h\.0'"):
        sch["transfomer.h.0"]  # nothing exists: close names anywhere
    with pytest.raises(slapo.PathError, match="must be a str"):
        sch[0]
    assert 0 not in sch


def test_create_schedule_rejects_non_module():
    with pytest.raises(slapo.SlapoError, match="expected an nn.Module"):
        slapo.create_schedule(lambda x: x)


def test_list_and_register_primitive():
    names = slapo.list_primitives()
    assert {"replace", "replace_all", "checkpoint", "annotate"} <= set(names)
    assert slapo.list_primitives(name_only=False)["replace"].name == "replace"

    class Freeze(slapo.Primitive):
        name = "freeze_for_test"

        @staticmethod
        def apply(sch, requires_grad: bool = False) -> int:
            """Freeze the module's parameters."""
            ps = list(sch.mod.parameters())
            for p in ps:
                p.requires_grad_(requires_grad)
            return len(ps)

    slapo.register_primitive(Freeze)
    sch = slapo.create_schedule(MLP())
    assert sch["fc1"].freeze_for_test() == 2
    assert not sch.mod.fc1.weight.requires_grad and sch.mod.fc2.weight.requires_grad
    assert "freeze_for_test" in slapo.list_primitives()
    assert slapo.Schedule.freeze_for_test.__doc__.startswith("Freeze")
    assert "sch['fc1'].freeze_for_test()" in str(sch.history)
    # re-registering the same class is a no-op; another class with the name is an error
    slapo.register_primitive(Freeze)

    class Other(Freeze):
        pass

    with pytest.raises(slapo.RegistryError, match="already registered"):
        slapo.register_primitive(Other)


@pytest.mark.parametrize("bad", ["not a class", int])
def test_register_primitive_rejects_non_primitives(bad):
    with pytest.raises(slapo.RegistryError, match="expects a Primitive subclass"):
        slapo.register_primitive(bad)


def test_register_primitive_rejects_bad_name_and_clash():
    class NoName(slapo.Primitive):
        @staticmethod
        def apply(sch):
            pass

    with pytest.raises(slapo.RegistryError, match="invalid name"):
        slapo.register_primitive(NoName)

    class Clash(slapo.Primitive):
        name = "path"

        @staticmethod
        def apply(sch):
            pass

    with pytest.raises(slapo.RegistryError, match="clashes"):
        slapo.register_primitive(Clash)

    class NoApply(slapo.Primitive):
        name = "no_apply_for_test"

    with pytest.raises(slapo.RegistryError, match="does not implement apply"):
        slapo.register_primitive(NoApply)


def test_errors_follow_template():
    err = slapo.ShardError("50257 is not divisible by 8", path="lm_head",
                           call="shard('weight', axis=0)", module=nn.Linear(768, 50257),
                           hint="pad vocab_size to a multiple of 8")
    assert str(err) == ("shard('weight', axis=0) on 'lm_head' (Linear 768->50257): 50257 is not "
                        "divisible by 8. Hint: pad vocab_size to a multiple of 8.")
    assert isinstance(err, slapo.SlapoError)
