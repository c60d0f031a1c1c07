import pytest

from tests.sharding.helpers import spawn_checks


@pytest.fixture(scope="session")
def hf_two_ranks():
    """The 2-rank HF-model checks of this directory in one spawn (each spawn imports torch and
    transformers on both ranks, seconds each)."""
    from tests.sharding.test_sequence_parallel import sp_gpt2_llama
    from tests.sharding.test_tp_models import tp_bert_gpt2_llama

    return spawn_checks([tp_bert_gpt2_llama, sp_gpt2_llama])
