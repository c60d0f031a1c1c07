RESULTS=docs/results/cpu.tsv bash end2end/run_all_single_node.sh end2end/configs/cpu.cfg --repeat 3 --require-quiet
