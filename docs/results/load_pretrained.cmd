nice -n 10 .venv/bin/python scripts/bench_load_pretrained.py > docs/results/load_pretrained.txt
