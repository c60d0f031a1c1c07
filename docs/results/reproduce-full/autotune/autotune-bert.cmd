RESULTS_DIR=docs/results/reproduce-full/autotune MODEL=bert SPACE=autotune/spaces/bert.py SEEDS=10 bash autotune/run.sh --require-quiet
