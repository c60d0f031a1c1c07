"""slapo.keep_freed_memory: measured by page faults (not time) in fresh processes, so the test
process's own allocator is left alone."""

import platform
import subprocess
import sys

import pytest

from slapo.cpu_allocator import MAX_MMAP_THRESHOLD, keep_freed_memory

_STEPS = r"""
import resource, sys, torch
import slapo
if sys.argv[1] == "tuned":
    assert slapo.keep_freed_memory()
def step():
    a = torch.ones(2048, 1024)  # 8 MiB, above glibc's default mmap threshold
    b = a * 2
    return float(b[0, 0])
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _STEPS, mode], check=True, capture_output=True,
                         text=True).stdout
    return int(out.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_freed_buffers_are_reused_without_page_faults():
    default, tuned = _faults("default"), _faults("tuned")
    # default: each step maps and touches two fresh 8 MiB buffers (~4k faults); tuned: reused
    assert default > 20 * 2000
    assert tuned < default / 8


def test_threshold_out_of_range_is_a_clear_error():
    with pytest.raises(ValueError, match="32 MiB"):
        keep_freed_memory(MAX_MMAP_THRESHOLD + 1)
    with pytest.raises(ValueError, match="1 .."):
        keep_freed_memory(0)
