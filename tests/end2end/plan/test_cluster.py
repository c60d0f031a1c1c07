"""The cluster spec: PROFILE:GPUSxNODES parsed, and every mistake one line naming the fix."""

import pytest

from end2end.plan.__main__ import main
from end2end.plan.cluster import ClusterError, parse_cluster


def test_a_spec_gives_devices_nodes_and_the_profile_numbers():
    c = parse_cluster("h100-80gb:8x4")
    assert (c.profile, c.gpus_per_node, c.nodes, c.gpus) == ("h100-80gb", 8, 4, 32)
    assert c.memory_bytes == 80 * 2 ** 30 and c.text == "h100-80gb:8x4"
    assert c.default_dtype() == "bf16" and c.note == ""
    assert parse_cluster("v100-32gb:8x1").default_dtype() == "fp16"  # no bf16 tensor cores


def test_the_estimate_takes_the_gemm_efficiency_of_the_dtype():
    """A V100 reaches a different fraction of its fp32 peak than of its Tensor Core peak
    (profiles.py SOURCES); the cluster keeps both and the estimate uses the run's."""
    v100 = parse_cluster("v100-32gb:8x1")
    assert v100.gemm_efficiency["float16"] == pytest.approx(83 / 125)
    assert v100.gemm_efficiency["float32"] == pytest.approx(83 / 7 / 15.7)
    assert parse_cluster("a100-80gb").gemm_efficiency["bfloat16"] == 0.869


def test_a_profile_alone_is_one_node_of_its_size():
    c = parse_cluster("a100-40gb")
    assert (c.gpus_per_node, c.nodes) == (8, 1)


def test_another_node_size_is_kept_and_the_network_assumption_noted():
    c = parse_cluster("h100-80gb:4x2")
    assert c.gpus == 8 and "nodes of 8 devices" in c.note


@pytest.mark.parametrize("text, words", [
    ("h100:8x4", ["unknown device profile 'h100'", "h100-80gb", "v100-32gb"]),
    ("h100-80gb:8by4", ["does not parse", "PROFILE:GPUSxNODES", "a100-40gb"]),
    ("h100-80gb:0x4", ["0 GPUs x 4 nodes", "at least 1"]),
    ("", ["does not parse"]),
])
def test_a_bad_spec_is_a_cluster_error_naming_the_fix(text, words):
    with pytest.raises(ClusterError) as err:
        parse_cluster(text)
    for word in words:
        assert word in str(err.value)


def test_the_command_answers_a_bad_cluster_in_one_line(capsys):
    assert main(["tiny/llama", "--cluster", "b200:8x1"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert err.startswith("end2end.plan: error:") and "h100-80gb" in err


def test_cpu_without_its_calibration_file_says_how_to_measure(tmp_path):
    with pytest.raises(ClusterError, match="calibrate"):
        parse_cluster("cpu:2x1", str(tmp_path / "missing.json"))
