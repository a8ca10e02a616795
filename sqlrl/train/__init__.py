"""Training: SFT, GRPO prompt selection, GRPO with the execution reward, the adapter merge,
multi-process launch and the vLLM server check."""
