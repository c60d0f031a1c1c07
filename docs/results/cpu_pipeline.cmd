RESULTS=docs/results/cpu_pipeline.tsv bash end2end/run_all_single_node.sh end2end/configs/cpu_pipeline.cfg --repeat 3 --require-quiet
