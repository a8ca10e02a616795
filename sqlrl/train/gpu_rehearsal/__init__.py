"""The GPU rehearsal: the reference profiles' training code at full size on one lent GPU, to
bring back the numbers that size the real run (docs/gpu-rehearsal.md is the how-to). The entry
point is `python scripts/gpu_rehearsal.py {bundle,install,run,check}` (cli.py: its commands and
flags); this package is its logic, one module per concept. It lives under sqlrl/train because
it rehearses the training path (train_sft, train_grpo, GRPO's prompt selection and rewards):
nothing outside sqlrl/train imports sqlrl.train.

- made on a CPU: bundle.py (the `bundle` command), rows.py (the rows and prompts it keeps),
  versions.py (which versions the run accepts: versions.json), plan.py (the install plan: the
  wheels the lent image lacks, packed into the device tool's calls);
- on the GPU machine: install.py (one call of the plan), run.py (the preflight and the phases,
  in order, under a budget), its phases model.py, sft.py, grpo_parts.py, colocate.py (vLLM, a
  process each) and grpo.py, with device.py (memory caps and peaks), budget.py (the wall clock)
  and report.py (gpu_rehearsal.json);
- common.py: what both sides share.

**Standard library only at import, every module.** The GPU machine runs `install` with the
image's python3 before the project's packages are there (only the image's own, `packaging`
among them), and the entry point imports the whole command line to parse it; so torch, trl,
transformers, sqlglot, ... and the rest of sqlrl (but sqlrl.jsonio, and sqlrl/train's
docstring-only __init__) are imported inside the functions that need them.
tests/train/test_gpu_rehearsal.py imports every module with `python -I -S` (no site-packages)
to keep it so.
"""
