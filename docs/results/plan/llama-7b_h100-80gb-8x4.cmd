# the planner's worked example (docs/planning.md): output llama-7b_h100-80gb-8x4.txt (progress
# lines, then the report), candidates llama-7b_h100-80gb-8x4.jsonl (--json)
# run 2026-12-03 08:33:51-08:43:59 UTC (607.6 s wall) on the 2-core development machine shared
# with other jobs (load average 6-7), HEAD db22ff7 with the planner of commit 27e62b4 (other
# sessions' uncommitted edits in the tree), a fresh cache; the default budget (12 minutes)
python -m end2end.plan llama-7b --cluster h100-80gb:8x4 --seq 4096 --json llama-7b_h100-80gb-8x4.jsonl --explain 1 --explain 2 --top 20
