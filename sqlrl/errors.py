"""The base of the errors that mean bad input or state, not a bug: a stage prints their
message as one line and exits 1 (stages.run_stage); anything else keeps its traceback."""


class PipelineError(Exception):
    """Bad input or state; the message names the cause and what to do."""
