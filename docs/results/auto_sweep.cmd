.venv/bin/python -m tests.model_schedule.test_auto_sweep --out docs/results/auto_sweep.tsv --jobs 2
