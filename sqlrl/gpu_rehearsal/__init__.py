"""The GPU rehearsal (scripts/gpu_rehearsal.py, docs/gpu-rehearsal.md)."""
