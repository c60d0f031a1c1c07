import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread():
    """The op tests run tiny tensors: with several threads on a shared 2-core machine, OpenMP
    spinning makes them ~10x slower than on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
