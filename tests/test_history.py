import torch
from torch import nn

import slapo
from slapo.testing import example_inputs, tiny_model, train_step


def make_schedule(model):
    sch = slapo.create_schedule(model)
    sch["bert.encoder.layer.0.intermediate.intermediate_act_fn"].replace(nn.GELU())
    sch["bert.encoder.layer.1"].checkpoint()
    sch["bert.encoder.layer.0.output.LayerNorm"].annotate("weight", "replicated_param", True)
    sch["bert.encoder.layer.1"].replace_all(nn.Dropout, make_no_dropout)
    return sch


def make_no_dropout(path, old):
    return nn.Dropout(0.0)


def test_history_renders_runnable_code():
    sch = make_schedule(tiny_model("bert"))
    code = str(sch.history)
    assert len(sch.history) == 4
    assert "sch['bert.encoder.layer.1'].checkpoint()" in code
    assert "sch['bert.encoder.layer.0.intermediate.intermediate_act_fn'].replace(objects[0])" \
        in code
    assert "annotate('weight', 'replicated_param', True)" in code
    assert f"replace_all(torch.nn.modules.dropout.Dropout, {__name__}.make_no_dropout)" in code
    # nested calls made by primitives (replace inside replace_all) are not recorded
    assert code.count(".replace(") == 1

    # executing the code on a fresh schedule reproduces the structure
    fresh = slapo.create_schedule(tiny_model("bert"))
    namespace = {"sch": fresh, "objects": sch.history.objects}
    exec(compile(code, "<history>", "exec"), namespace)
    assert str(fresh.mod) == str(sch.mod)


def test_replay_gives_same_structure_and_outputs():
    original = make_schedule(tiny_model("bert"))
    replayed = original.history.replay(tiny_model("bert"))
    a, b = original.mod, replayed.mod
    assert [(n, p.shape) for n, p in a.named_parameters()] == \
        [(n, p.shape) for n, p in b.named_parameters()]
    assert str(a) == str(b)
    assert b.bert.encoder.layer[0].output.LayerNorm.weight.replicated_param is True
    inputs = example_inputs("bert")
    out_a, grads_a = train_step(a, inputs)
    out_b, grads_b = train_step(b, inputs)
    torch.testing.assert_close(out_b, out_a)
    torch.testing.assert_close(grads_b, grads_a)
    assert str(replayed.history) == str(original.history)


def test_replay_snapshots_module_arguments():
    model = slapo.testing.MLP()
    sch = slapo.create_schedule(model)
    new = nn.Linear(16, 32)
    sch["fc1"].replace(new)
    with torch.no_grad():
        new.weight.zero_()  # changed after the call: the replay must not see it
    replayed = sch.history.replay(slapo.testing.MLP())
    assert replayed["fc1"].mod is not new
    assert replayed.mod.fc1.weight.abs().sum() > 0
    # replaying twice gives independent modules
    again = sch.history.replay(slapo.testing.MLP())
    assert again.mod.fc1 is not replayed.mod.fc1


def test_failed_calls_are_not_recorded():
    sch = slapo.create_schedule(slapo.testing.MLP())
    try:
        sch["fc1"].replace(torch.relu)
    except slapo.ReplaceError:
        pass
    assert len(sch.history) == 0
