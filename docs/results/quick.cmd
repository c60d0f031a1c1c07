SKIP_SETUP=1 RESULTS=docs/results/quick.tsv bash end2end/run_all_single_node.sh end2end/configs/quick.cfg
