"""sql-rl-pipeline: teach code LLMs to write SQL with SFT and execution-rewarded GRPO."""
