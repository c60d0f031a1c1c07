RESULTS_DIR=docs/results bash ablation/run.sh --scale cpu --repeat 3 --require-quiet
