"""Models: building or loading them (scratch or hub), the Qwen2.5 tokenizer offline, and batched
generation (transformers or vLLM) that evaluation, prompt selection and serving share."""
