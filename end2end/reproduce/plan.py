"""What ``scripts/reproduce.sh`` runs: one :class:`Step` per figure or table of the paper, at CPU
scale and at the paper's scale predicted, for two plans (``quick`` and ``full``).

Every step is the command the docs give for its figure (``end2end/run_all_single_node.sh``,
``ablation/run.sh``, ``autotune/run.sh``, ``python -m usability.loc``, ``python -m
end2end.simulate``, ``python -m autotune.predicted_grid``), with its results sent under the
output folder; nothing is copied from the committed results. The page then shows each result
beside the committed one (:attr:`Step.committed`) and the paper's value (:attr:`Step.paper`).

**quick** (about 15 minutes on 2 idle cores): the tiny models (2 layers) through every CPU flow,
one round (Figure 7: 2 rounds of ``quick.cfg``), the auto-tuning flow on a 6-candidate space, and
the paper-scale predictions of one panel each (Figure 7: GPT-2.9B on 2/4/8 V100s; Figure 8:
LLaMA-7B on 16 V100s; Figure 9: BERT-1B; Figure 10: the batch-28 column of the grid). It checks
that everything runs end to end and draws every figure; its numbers are not the study's.
**full**: the committed studies' own commands (``docs/results/*.cmd``): 3 interleaved rounds
of every CPU config, the 25-candidate tuning grid, every paper-scale prediction (hours).

Estimates (:attr:`Step.estimate_s`) are seconds on 2 idle cores, from the committed commands'
durations (the README's commands table, ``docs/results/commands.src.tsv``) or, for the quick
steps, their run counts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Tuple

__all__ = ["Step", "Figure", "PLANS", "plan", "step_names"]

SIM = "v100-32gb"  # the paper's p3dn.24xlarge (8 x V100 32 GB)


@dataclass(frozen=True)
class Figure:
    """A figure this step draws (``path`` under the output folder) and the committed one it is
    laid beside (``committed``: a repository path, ``""`` when nothing is committed)."""

    path: str
    committed: str = ""


@dataclass(frozen=True)
class Step:
    """One figure or table: the commands that make it, and what the page shows of it.

    ``commands`` are argument lists run from the repository root, in order, with ``{out}``
    replaced by the step's folder (``DIR/<name>``) and ``{python}`` by the interpreter; a
    command whose last two items are ``">"`` and a file writes its standard output there.
    ``blocks`` are report blocks (:mod:`end2end.report`) over the new files (paths under the
    step's folder); ``committed`` the same kinds over the committed files.
    """

    name: str
    title: str
    what: str
    commands: Tuple[Tuple[str, ...], ...]
    estimate_s: float
    figures: Tuple[Figure, ...] = ()
    blocks: Tuple[Tuple[str, ...], ...] = ()
    committed: Tuple[Tuple[str, ...], ...] = ()
    paper: str = ""  # a key of end2end.report.paper.PAPER, or the paper's value as text
    env: Dict[str, str] = field(default_factory=dict)


def _sweep(config: str, rounds: int) -> Tuple[str, ...]:
    return ("bash", "end2end/run_all_single_node.sh", f"end2end/configs/{config}.cfg",
            "--repeat", str(rounds))


def _cpu_steps(quick: bool) -> List[Step]:
    fig7, peers, pipeline, fusions = (("quick", "quick_peers", "quick_pipeline", "quick_fusions")
                                      if quick else ("cpu", "cpu_peers", "cpu_pipeline",
                                                     "cpu_fusions"))
    rounds = 1 if quick else 3
    ablation = ("tiny-bert",) if quick else ("bert", "gpt-neo")
    tune = "tiny-bert" if quick else "bert"
    return [
        Step("table4", "Table 4: schedule lines of code",
             "the lines of each model's Slapo schedule (python -m usability.loc)",
             (("{python}", "-m", "usability.loc", "--json", "{out}/loc.json", ">",
               "{out}/loc.md"),), 15,
             blocks=(("include", "loc.md"),),
             paper="Table 4: 10-21 lines per model schedule (its `paper (Table 4)` column above)"),
        Step("fig7", "Figure 7 on CPU: Slapo against Megatron-LM and DeepSpeed",
             f"end2end/configs/{fig7}.cfg, {2 if quick else 3} interleaved rounds",
             (_sweep(fig7, 2 if quick else 3),),
             80 if quick else 1300,
             figures=(Figure(f"{fig7}-fig7.png", "docs/figures/cpu-fig7.png"),),
             blocks=(("results", f"{fig7}.tsv"), ("best", f"{fig7}.tsv")),
             committed=(("results", "docs/results/cpu.tsv"), ("best", "docs/results/cpu.tsv")),
             paper="single", env={"RESULTS": f"{{out}}/{fig7}.tsv"}),
        Step("peers", "Today's PyTorch peers: FSDP2 and DTensor TP",
             f"end2end/configs/{peers}.cfg, {rounds} round(s)", (_sweep(peers, rounds),),
             60 if quick else 940,
             figures=(Figure(f"{peers}-peers.png", "docs/figures/cpu-peers.png"),),
             blocks=(("results", f"{peers}.tsv", "--peers"),),
             committed=(("results", "docs/results/cpu_peers.tsv", "--peers"),),
             paper="not in the paper (PyTorch's FSDP2 and DTensor came later)",
             env={"RESULTS": f"{{out}}/{peers}.tsv"}),
        Step("pipelines", "Pipelines: Slapo's pipeline on the torch and DeepSpeed runtimes",
             f"end2end/configs/{pipeline}.cfg, {rounds} round(s)", (_sweep(pipeline, rounds),),
             75 if quick else 580,
             figures=(Figure(f"{pipeline}-fig7.png", "docs/figures/cpu-pipeline.png"),),
             blocks=(("results", f"{pipeline}.tsv"),),
             committed=(("results", "docs/results/cpu_pipeline.tsv"),),
             paper="the paper's pipelines run at 16-64 GPUs (Figure 8); no CPU value",
             env={"RESULTS": f"{{out}}/{pipeline}.tsv"}),
        Step("fusions", "Fusions: the BERT recipe's torch.compile fusions",
             f"end2end/configs/{fusions}.cfg, {rounds} round(s)", (_sweep(fusions, rounds),),
             90 if quick else 240,
             figures=(Figure(f"{fusions}-fig7.png", "docs/figures/cpu-fusions.png"),),
             blocks=(("results", f"{fusions}.tsv"),),
             committed=(("results", "docs/results/cpu_fusions.tsv"),),
             paper="part of the paper's '+ Kernel Opt' step (Figure 9)",
             env={"RESULTS": f"{{out}}/{fusions}.tsv"}),
        Step("ablation", "Figure 9 on CPU: the progressive ablation",
             f"ablation/run.sh --scale {'tiny' if quick else 'cpu'}, {rounds} round(s)",
             (("bash", "ablation/run.sh", "--scale", "tiny" if quick else "cpu",
               "--repeat", str(rounds)),), 70 if quick else 370,
             figures=tuple(Figure(f"ablation-{m}.png", "" if quick else
                                  f"docs/figures/cpu-ablation-{m}.png") for m in ablation),
             blocks=tuple(("ablation", f"ablation-{m}.tsv") for m in ablation),
             committed=(("ablation", "docs/results/ablation-bert.tsv"),
                        ("ablation", "docs/results/ablation-gpt-neo.tsv")),
             paper="ablation", env={"RESULTS_DIR": "{out}"}),
        Step("autotune", "Figure 10 on CPU: the auto-tuning study",
             f"autotune/run.sh on autotune/spaces/{tune.replace('-', '_')}.py: the grid, "
             "search and TPE replayed on it, seeds",
             (("bash", "autotune/run.sh"),), 100 if quick else 470,
             figures=(Figure(f"autotune-{tune}.png", "docs/figures/cpu-autotune-bert.png"),),
             blocks=(("grid", f"autotune-{tune}.db"),),
             committed=(("grid", "docs/results/autotune-bert.db", "grid", "grid-2"),),
             paper="tune",
             env={"RESULTS_DIR": "{out}", "MODEL": tune.replace("-", "_"),
                  "SPACE": f"autotune/spaces/{tune.replace('-', '_')}.py", "SEEDS": "10"}),
    ]


def _simulate(config: str, results: str, *only: str) -> Tuple[str, ...]:
    words = tuple(x for word in only for x in ("--only", word))
    return ("{python}", "-m", "end2end.simulate", config, "--device", SIM, "--results",
            f"{{out}}/{results}", *words)


def _paper_steps(quick: bool) -> List[Step]:
    fig7 = f"single_node_asplos24.{SIM}.sim.tsv"
    fig8 = f"multi_node_fig8.{SIM}.sim.tsv"
    fig9 = f"ablation-paper-bert.{SIM}.sim.tsv"
    grid = f"autotune-bert-paper.{SIM}.predictions.jsonl"
    seeds = f"autotune-bert-paper.{SIM}.seeds.jsonl"
    return [
        Step("sim-fig7", "Figure 7 at the paper's scale, predicted (8 x V100)",
             "end2end/configs/single_node_asplos24.cfg simulated on v100-32gb"
             + (" (GPT-2.9B only)" if quick else ""),
             (_simulate("end2end/configs/single_node_asplos24.cfg", fig7,
                        *(("gpt-neo",) if quick else ())),
              ("{python}", "-m", "end2end.plot", f"{{out}}/{fig7}", "-o",
               "{out}/single_node_asplos24-fig7")), 130 if quick else 500,
             figures=(Figure("single_node_asplos24-fig7.png"),),
             blocks=(("best", fig7),),
             committed=(("best", f"docs/results/{fig7}"),), paper="single"),
        Step("sim-fig8", "Figure 8 at the paper's scale, predicted (16-64 V100s)",
             "end2end/configs/multi_node_fig8.cfg simulated on v100-32gb"
             + (" (LLaMA-7B on 16 GPUs only)" if quick else ""),
             (_simulate("end2end/configs/multi_node_fig8.cfg", fig8,
                        *(("llama-7b", "n=16") if quick else ())),
              ("{python}", "-m", "end2end.plot", f"{{out}}/{fig8}", "-o",
               "{out}/multi_node_fig8-fig7")), 120 if quick else 620,
             figures=(Figure("multi_node_fig8-fig7.png"),),
             blocks=(("best", fig8),),
             committed=(("best", f"docs/results/{fig8}"),), paper="multi"),
        Step("sim-fig9", "Figure 9 at the paper's scale, predicted (BERT-1B, 1 and 8 V100s)",
             "ablation/configs/paper-bert.cfg simulated on v100-32gb",
             (("{python}", "-m", "end2end.simulate", "ablation/configs/paper-bert.cfg",
               "--device", SIM, "--results", f"{{out}}/{fig9}"),), 60 if quick else 90,
             blocks=(("ablation-predicted", fig9),),
             committed=(("ablation-predicted", f"docs/results/{fig9}"),), paper="ablation"),
        Step("sim-fig10", "Figure 10 at the paper's scale, predicted (BERT-1B, 8 V100s)",
             "the tuning grid of autotune/spaces/bert_paper.py predicted"
             + (" (batch 28 only)" if quick else " (88 candidates)"),
             (("{python}", "-m", "autotune.predicted_grid", "--space",
               "autotune/spaces/bert_paper.py", "--predictions", f"{{out}}/{grid}", "--simulate",
               *(("--batches", "28") if quick else ()), "--json", f"{{out}}/{seeds}"),),
             90 if quick else 900,
             blocks=(("grid-predicted", grid, "--seeds", seeds),),
             committed=(("grid-predicted", f"docs/results/{grid}", "--seeds",
                         f"docs/results/{seeds}"),), paper="tune"),
    ]


PLANS = ("quick", "full")


def plan(name: str) -> List[Step]:
    """The steps of the plan ``name`` (``quick`` or ``full``), in the order they run."""
    if name not in PLANS:
        raise ValueError(f"unknown plan {name!r}")
    quick = name == "quick"
    return _cpu_steps(quick) + _paper_steps(quick)


def step_names() -> List[str]:
    """Every step's name, in order (the same in both plans)."""
    return [step.name for step in plan("quick")]
