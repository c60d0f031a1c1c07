RESULTS_DIR=docs/results bash ablation/run.sh --repeat 3
