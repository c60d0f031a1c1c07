# the reduced-depth extrapolation against full-depth simulations: the first 4 candidates of the
# plan's queue simulated at 2 and 4 layers per stage (--reduce-above 0), extrapolated to 32,
# then each simulated at its 32 layers (--check 4); output: llama-7b_h100-80gb-8x4.check.txt
# run 2026-12-03 08:23-08:32 UTC on the 2-core development machine shared with other jobs
# (load average 8-10), planner at commit fa3433c (other sessions' edits in the tree)
python -m end2end.plan llama-7b --cluster h100-80gb:8x4 --seq 4096 --reduce-above 0 --max-candidates 4 --check 4 --top 4
