"""Memory and communication of the modelled ZeRO-3 and the steady-state step (issue 35):
activations are what the forward and backward hold (never the optimizer's moments or the
model's gradients), the optimizer's temporaries count once (CUDA's multi-tensor AdamW; ZeRO-3's
sub-group step), and ZeRO-3 gathers per module with the first gather of a pass exposed."""

from __future__ import annotations

import pytest
import torch

from end2end.simulate.engine.isolated import isolated

MODEL, SEQ, N = "cpu/bert", 256, 4


def test_steady_state_peak_holds_the_moments_through_forward_and_backward():
    """The first step creates AdamW's moments in its optimizer phase; later steps start with
    them: the forward/backward peak carries them, and they never count as activations."""
    from end2end.simulate.engine.step import steady_memory

    before = dict(param=100, buffer=0, grad=0, optstate=0)
    after = dict(param=100, buffer=0, grad=100, optstate=200)
    # activations dominate: 500 live at the backward's peak (with 60 gradient bytes so far)
    mem = steady_memory(100, dict(forward=400, backward=500, optimizer=420), before, after)
    assert mem["peak"] == 100 + 500 + 200
    assert mem["activation"] == 100 + 500 + 200 - 400
    # the optimizer phase dominates (gradients + moments + temporaries): the activation is
    # still the forward/backward's, not the optimizer's temporaries
    mem = steady_memory(100, dict(forward=50, backward=120, optimizer=900), before, after)
    assert mem["peak"] == 100 + 900 and mem["activation"] == 20
    small = steady_memory(100, dict(forward=50, backward=110, optimizer=900), before, after)
    assert small["activation"] == 10  # follows the backward, not the optimizer (900 both)
    # what follows the optimizer's step (the moments alive, the loss read back) is no forward
    late = steady_memory(100, dict(forward=50, backward=110, optimizer=300, after=350),
                         before, after)
    assert late["activation"] == 10 and late["peak"] == 100 + 350


def test_bytes_after_the_optimizer_step_are_not_the_forwards():
    """Found on GPT-10B (ZeRO-3, 64 V100s): the moments created in the step stayed alive when the
    post-step hook set the phase back to forward, and became a 39.5 GB "activation"."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from end2end.simulate.engine.recorder import StepRecorder
    from end2end.simulate.engine.step import _optimizer_phase

    with FakeTensorMode():
        w = torch.nn.Parameter(torch.randn(512, 512))
        opt = torch.optim.AdamW([w])
        rec = StepRecorder()
        hooks = _optimizer_phase(rec)
        try:
            with rec:
                (w * 2).sum().backward()
                opt.step()
                (w.detach() + 1).sum()
        finally:
            for h in hooks:
                h.remove()
    moments = 2 * 512 * 512 * 4
    assert rec.phase_peak["after"] >= moments
    assert max(rec.phase_peak["forward"], rec.phase_peak["backward"]) < moments


def test_gpu_profiles_count_multi_tensor_adamws_temporary_once():
    """On CUDA, AdamW runs its foreach form: the sqrt of every second moment exists at once
    (one temporary the size of the parameters); the CPU's per-parameter loop holds one."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from end2end.simulate.engine.recorder import StepRecorder
    from end2end.simulate.engine.step import multi_tensor_optimizer

    def optimizer_peak(gpu: bool) -> int:
        with FakeTensorMode():
            params = [torch.nn.Parameter(torch.randn(256, 256)) for _ in range(8)]
            for p in params:
                p.grad = torch.randn_like(p)
            opt = torch.optim.AdamW(params)
            switched = multi_tensor_optimizer(opt) if gpu else False
            assert switched == gpu
            opt.step()  # the moments exist from now on
            with StepRecorder() as rec:
                opt.step()
        return rec.peak

    one = 256 * 256 * 4
    assert optimizer_peak(True) >= 8 * one
    assert optimizer_peak(False) <= 3 * one
    explicit = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], foreach=False)

    assert not multi_tensor_optimizer(explicit)  # a choice made by the user stays


def zero3_rank(batch: int, ckpt: str) -> dict:
    """Rank 0 of ``deepspeed`` (ZeRO-3 modelled) on a V100: memory, collectives (summary)."""
    from end2end.simulate.engine.step import simulate_rank
    from end2end.spec.config_file import make_run_spec
    from end2end.spec.layout import run_layout

    spec = make_run_spec("deepspeed", MODEL, N, SEQ, 0, batch, ckpt, steps=1, warmup=0,
                         dtype="fp16")
    r = simulate_rank(spec, run_layout(spec), 0, (7, 0))
    gathers = [c for c in r.collectives if c.kind == "allgather"]
    return dict(memory=r.memory, parameters=r.parameters,
                gathers={ph: [(c.bytes, c.exposed) for c in gathers if c.phase == ph]
                         for ph in ("forward", "backward")},
                scatters=[c.bytes for c in r.collectives if c.kind == "reducescatter"])


def forward_saved(batch: int) -> int:
    """Bytes the same run's forward leaves alive for its backward on rank 0 (the stand-in's
    model in fp16 on fake tensors, V100 attention): a lower bound of any honest activation."""
    from end2end.driver.assemble import build_runner, rank_batch
    from end2end.simulate.cost.kernels import GpuAttention
    from end2end.simulate.engine.fake_world import fake_world
    from end2end.simulate.engine.modelled import Modelled
    from end2end.simulate.engine.recorder import StepRecorder
    from end2end.spec.config_file import make_run_spec
    from end2end.spec.layout import run_layout
    from slapo.runtime.distributed import init_distributed

    spec = make_run_spec("deepspeed", MODEL, N, SEQ, 0, batch, "0", steps=1, warmup=0,
                         dtype="fp16")
    layout = run_layout(spec)
    with fake_world(0, N):
        env = init_distributed()
        runner = build_runner(spec, layout, spec.low_precision_dtype, env.device,
                              builders=Modelled.for_run(spec, layout).builders)
        batch_ = rank_batch(spec, layout, 0, env.device, spec.low_precision_dtype)
        with StepRecorder() as rec, GpuAttention((7, 0)):
            loss = runner.model(**batch_).loss
        saved = rec.live
        del loss
    return saved


@pytest.mark.timeout(600)
def test_zero3_activation_is_what_the_step_holds_and_grows_with_the_batch():
    """ZeRO-3's activation holds at least what the forward keeps for the backward (before,
    the step's peak less the states after it took AdamW's moments off, or was the optimizer's
    temporaries: the same figure for different batches and checkpointing), grows with the
    batch without checkpointing, and shrinks with it."""
    small, big = isolated(f"{__name__}.zero3_rank", 16, "0"), isolated(
        f"{__name__}.zero3_rank", 64, "0")
    ckpt = isolated(f"{__name__}.zero3_rank", 64, "1")
    saved = {b: isolated(f"{__name__}.forward_saved", b) for b in (16, 64)}
    act = {k: v["memory"]["activation"] for k, v in
           dict(small=small, big=big, ckpt=ckpt).items()}
    print("activation", act, "forward saved", saved)
    assert act["small"] >= saved[16] and act["big"] >= saved[64], (act, saved)
    assert act["big"] - act["small"] >= 0.9 * (saved[64] - saved[16]), (act, saved)
    assert act["ckpt"] < act["big"] / 2, act
    # the peak: states + the larger of (activations + working set) and the optimizer's
    # sub-group temporaries (fp32 gradient + the foreach sqrt: 8 bytes per partition element)
    mem = big["memory"]
    partition = big["parameters"] // N
    assert mem["optimizer_temp"] == 8 * partition
    states = mem["param"] + mem["grad"] + mem["optstate"] + mem["buffer"]
    assert mem["peak"] == states + max(mem["activation"] + mem["working"],
                                       mem["optimizer_temp"])


@pytest.mark.timeout(600)
def test_zero3_gathers_each_module_and_exposes_the_first_of_a_pass():
    r = isolated(f"{__name__}.zero3_rank", 16, "1")
    fwd, bwd = r["gathers"]["forward"], r["gathers"]["backward"]
    assert len(fwd) > 10 and len(bwd) == 2 * len(fwd)  # recomputation gathers again
    # every partitioned parameter once per pass in fp16 (a tied one once per module using it,
    # as DeepSpeed's pre-forward hooks fetch it; biases and norms stay whole: persistent)
    gathered = sum(b for b, _ in fwd)
    assert 0.95 * 2 * r["parameters"] <= gathered <= 2 * 2 * r["parameters"], gathered
    assert [e for _, e in fwd] == [True] + [False] * (len(fwd) - 1)
    assert sum(e for _, e in bwd) == 2  # the backward pass and the recomputation's
    assert sum(r["scatters"]) == 2 * r["parameters"]  # one reduce bucket (< 5e8 elements)


def test_an_exposed_collective_is_not_hidden_by_its_phases_compute():
    from end2end.simulate.cost.profiles import PROFILES
    from end2end.simulate.cost.records import CollectiveRecord, OpRecord
    from end2end.simulate.cost.timing import rank_seconds

    v100 = PROFILES["v100-32gb"]
    ops = [OpRecord(10 ** 13, 0, "float16", "forward", name="mm")]
    hidden = CollectiveRecord("allgather", 10 ** 8, 16, tuple(range(16)), "forward")
    exposed = CollectiveRecord("allgather", 10 ** 8, 16, tuple(range(16)), "forward",
                               exposed=True)
    t_hidden = rank_seconds(ops, [hidden], v100, {"allgather"})
    t_exposed = rank_seconds(ops, [exposed], v100, {"allgather"})
    assert t_hidden["comm_exposed"] == 0 and t_hidden["comm_hidden"] > 0
    assert t_exposed["comm_exposed"] == pytest.approx(t_hidden["comm_hidden"])


def megatron_optimizer_ops() -> dict:
    """The optimizer phase of a ``megatron`` fp16 step on a V100 profile: its ops by name."""
    from end2end.simulate.engine.step import simulate_rank
    from end2end.spec.config_file import make_run_spec
    from end2end.spec.layout import run_layout

    spec = make_run_spec("megatron", "tiny/gpt2", 1, 32, 0, 2, "0", steps=1, warmup=0,
                         dtype="fp16")
    result = simulate_rank(spec, run_layout(spec), 0, gpu=(7, 0))
    names: dict = {}
    for op in result.ops:
        if op.phase == "optimizer" and not op.view:
            names[op.name] = names.get(op.name, 0) + op.weight
    return names


def test_megatrons_wrapped_adamw_runs_fused_on_a_gpu_profile():
    """megatron-core's mixed-precision optimizer steps a torch AdamW over the fp32 masters; on
    CUDA the driver runs it fused, as Megatron-LM's FusedAdam, so on a GPU profile its step is
    one fused kernel, neither a loop over every parameter (each op priced at the host's floor
    per op) nor the foreach form with its square-root temporary."""
    from end2end.simulate.engine.isolated import isolated

    names = isolated("tests.end2end.simulate.test_zero3.megatron_optimizer_ops")
    assert names.get("_fused_adamw_", 0) == 1, names
    assert not {"sqrt", "_foreach_sqrt"} & set(names), names
