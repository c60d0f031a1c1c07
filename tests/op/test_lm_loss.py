"""VocabParallelLMLoss: the masked-LM and seq2seq losses of HF models computed on vocab-sharded
logits equal HF's own loss and gradients (1 rank, and TP=2 behind the model schedules)."""

import copy
import warnings

import pytest
import torch

from slapo import SlapoError
from slapo.model_schedule import apply_schedule
from slapo.op.lm_loss import VocabParallelLMLoss
from slapo.runtime.forward_wrap import install_forward_wrapper
from slapo.sharding import get_shard_spec
from slapo.testing import example_inputs, run_distributed, tiny_model
from tests.model_schedule.helpers import compare_training

KINDS = {"bert": "masked", "roberta": "masked", "t5": "seq2seq"}


def _one_step(model, inputs, *args):
    model.zero_grad(set_to_none=True)
    out = model(*args, **inputs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", sorted(KINDS))
def test_one_rank_equals_hf_loss_and_gradients(family):
    ref, inputs = tiny_model(family).eval(), example_inputs(family)  # eval: no dropout
    model = copy.deepcopy(ref)
    install_forward_wrapper(model, "lm_loss", VocabParallelLMLoss(KINDS[family]))
    want, want_grads = _one_step(ref, inputs)
    got, got_grads = _one_step(model, inputs)
    assert list(got.keys()) == list(want.keys())  # same output type, loss first
    torch.testing.assert_close(got.loss, want.loss)
    torch.testing.assert_close(got.logits, want.logits)
    assert want_grads.keys() == got_grads.keys()
    for name, g in want_grads.items():
        torch.testing.assert_close(got_grads[name], g, msg=lambda m, n=name: f"{n}: {m}")


def test_positional_labels_tuple_outputs_and_no_labels():
    ref, inputs = tiny_model("bert").eval(), example_inputs("bert")
    model = copy.deepcopy(ref)
    install_forward_wrapper(model, "lm_loss", VocabParallelLMLoss("masked"))
    labels = inputs.pop("labels")
    args = (inputs["input_ids"], inputs["attention_mask"], None, None, None, None, None, labels)
    want = ref(*args, return_dict=False)
    got = model(*args, return_dict=False)
    assert isinstance(got, tuple) and len(got) == len(want)
    torch.testing.assert_close(got[0], want[0])
    plain = model(**inputs)
    assert plain.loss is None and torch.equal(plain.logits, ref(**inputs).logits)


def test_errors():
    with pytest.raises(SlapoError, match="unknown LM loss kind 'causal'.*Hint: use one of masked"):
        VocabParallelLMLoss("causal")
    with pytest.raises(SlapoError, match="must be installed as a forward wrapper"):
        VocabParallelLMLoss("masked")(lambda **kw: None, labels=torch.zeros(1))


def _tp2():
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    seen = {}
    for family in sorted(KINDS):
        ref, inputs = tiny_model(family), example_inputs(family)
        model = copy.deepcopy(ref)
        sch = apply_schedule(model, family)
        assert sch.root.metadata["vocab_parallel_loss"] == KINDS[family]
        head = [p for n, p in model.named_parameters() if get_shard_spec(p) is not None
                and p.shape[0] * 2 == ref.config.vocab_size]
        assert head, f"{family}: no vocab-sharded parameter"
        with torch.no_grad():
            logits = model(**inputs).logits
        seen[family] = logits.shape[-1]  # the rank's vocabulary shard: no all-gather
        compare_training(ref, model, inputs, group=sch.group)  # loss, logits, every gradient
    return seen


def test_tp2_masked_lm_and_seq2seq_losses_equal_hf():
    results = run_distributed(_tp2, 2, timeout=300)
    vocab = tiny_model("bert").config.vocab_size
    assert results[0] == results[1] == {f: vocab // 2 for f in sorted(KINDS)}
