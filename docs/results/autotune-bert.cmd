RESULTS_DIR=docs/results bash autotune/run.sh
AUTOTUNE_RESULTS=docs/results/autotune-bert.tsv python -m slapo.autotune --space autotune/spaces/bert.py --strategy grid --study grid-2 --db docs/results/autotune-bert.db
python -m autotune.seeds --db docs/results/autotune-bert.db --space autotune/spaces/bert.py --grid grid --grid grid-2 --seeds 10 --budget 8 --json docs/results/autotune-bert-seeds.jsonl > docs/results/autotune-bert-seeds.md
