"""Slapo's data-parallel group beside a tensor-parallel one (``slapo-fsdp`` with TP: FSDP2 over
the replicas of a TP group) learns every rank's TP group by an object all-gather
(:func:`slapo.dialects.common.tensor_parallel_layouts`), which the simulator's fake process
group cannot deliver (no data); the fake world answers it from the groups the process created
(end2end/simulate/engine/fake_world.py). Before, every ``slapo-fsdp`` run with TP > 1 was a
``fail`` prediction (``DataDependentOutputException``) and the planner never ranked one."""

from __future__ import annotations

from end2end.simulate.engine.isolated import isolated

HERE = "tests.end2end.simulate.test_tp_data_parallel_groups"


def _layouts(world: int, rank: int, groups, subgroup_size: int, mine):
    """Rank ``rank`` of a fake ``world``: create ``groups`` (one ``new_group`` each), then
    ``new_subgroups(subgroup_size)`` if given, then ask for every rank's group of ``mine``."""
    import torch.distributed as dist

    from end2end.simulate.engine.fake_world import fake_world
    from slapo.dialects import common

    with fake_world(rank, world):
        for ranks in groups:
            dist.new_group(ranks)
        if subgroup_size:
            dist.new_subgroups(group_size=subgroup_size)
        try:
            return common.tensor_parallel_layouts(mine)
        except RuntimeError as exc:
            return str(exc)


def _simulated(mode: str, n: int, tp: int) -> dict:
    from end2end.simulate.cost.profiles import get_profile
    from end2end.simulate.engine.run import simulate_in_process
    from end2end.spec.config_file import make_run_spec

    spec = make_run_spec(mode, "tiny/llama", n, 64, 0, 2 * n, "0", steps=1, warmup=0,
                         dtype="fp32", tp=tp, pp=1)
    row = simulate_in_process(spec, get_profile("v100-32gb"))
    return dict(status=row["status"], error=row["error"],
                layout=row.get("extra", {}).get("layout", {}))


def test_blocks_made_by_new_subgroups_are_read_back_for_every_rank():
    got = isolated(f"{HERE}._layouts", 4, 3, [], 2, [2, 3])
    assert got == [[0, 1], [0, 1], [2, 3], [2, 3]]


def test_the_family_of_groups_holding_mine_is_chosen_among_others():
    # blocks first, then strided groups: rank 1's TP group is the strided [1, 3]
    groups = [[0, 1], [2, 3], [0, 2], [1, 3]]
    assert isolated(f"{HERE}._layouts", 4, 1, groups, 0, [1, 3]) == \
        [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert isolated(f"{HERE}._layouts", 4, 1, groups, 0, [0, 1]) == \
        [[0, 1], [0, 1], [2, 3], [2, 3]]


def test_the_whole_world_and_an_unknown_group():
    assert isolated(f"{HERE}._layouts", 2, 0, [], 0, [0, 1]) == [[0, 1], [0, 1]]
    error = isolated(f"{HERE}._layouts", 4, 0, [[0, 1]], 0, [0, 1])
    assert "cannot tell the other ranks' tensor-parallel groups" in error


def test_slapo_fsdp_with_tensor_parallelism_simulates():
    row = isolated(f"{HERE}._simulated", "slapo-fsdp", 4, 2)
    assert row["status"] == "sim", row["error"]
    assert (row["layout"]["tp"], row["layout"]["dp"]) == (2, 2)
