.venv/bin/python -m tests.model_schedule.test_auto_sweep --out docs/results/auto_sweep.tsv --jobs 4
.venv/bin/python -m tests.model_schedule.test_auto_sweep --out docs/results/auto_sweep.tsv --jobs 2 --memory-gb 4 --timeout 400 <the unbuilt, unapplied and broken rows, deleted from the TSV first>
.venv/bin/python -m tests.model_schedule.test_auto_sweep llama4 llama4_text --out docs/results/auto_sweep.tsv --jobs 2 <their two rows deleted from the TSV first; rows kept in plan_families() order>
