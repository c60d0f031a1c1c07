"""``explain`` of a sharded BERT layer (TP=2) is stable: this is the text shown in the README."""

EXPECTED = """\
BertLayer at 'bert.encoder.layer.0': 7 of 18 modules changed
  attention.self (BertSelfAttention): local num_attention_heads=2, all_head_size=16; sync bwd_post all_reduce
  attention.self.query (Linear 32->16): shard weight [32, 32]->[16, 32] axis 0, bias [32]->[16] axis 0; output partition(axis=-1)
  attention.self.key (Linear 32->16): shard weight [32, 32]->[16, 32] axis 0, bias [32]->[16] axis 0; output partition(axis=-1)
  attention.self.value (Linear 32->16): shard weight [32, 32]->[16, 32] axis 0, bias [32]->[16] axis 0; output partition(axis=-1)
  attention.output.dense (LinearWithSync): replaced Linear -> LinearWithSync; shard weight [32, 32]->[32, 16] axis 1; sync fwd_post all_reduce; output replicated
  intermediate.dense (LinearWithGradSync): replaced Linear -> LinearWithGradSync; shard weight [64, 32]->[32, 32] axis 0, bias [64]->[32] axis 0; sync bwd_post all_reduce; output partition(axis=-1)
  output.dense (LinearWithSync): replaced Linear -> LinearWithSync; shard weight [32, 64]->[32, 32] axis 1; sync fwd_post all_reduce; output replicated"""  # noqa: E501


def test_explain_sharded_bert_layer(results):
    for r in results:
        assert r["explain"] == EXPECTED
