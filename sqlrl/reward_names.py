"""The built-in GRPO rewards, by the names grpo.reward_weights gives them: the one registry.

Each name maps to its builder in sqlrl/train/rewards.py (`module:function`, the syntax of a
user's own reward): `reward_registry` there calls every builder with the run's judging state
(limits, schema repair, executable credit, the answer format's extractor), and sqlrl.params
refuses, when the params load, a reward weight that is neither a name here nor a
`package.module:function`. Adding a reward is its builder there and its line here.

The builders are named, not imported, because every stage imports sqlrl.params: importing the
judge (sqlglot, worker pools) from here would cost every stage that import and make every
stage depend on the reward's code (dvc.yaml), and sqlrl/train is imported only by training.
"""

from __future__ import annotations

# name in grpo.reward_weights -> the builder of its function (whose __name__ TRL logs:
# execution_reward, syntax_reward, format_reward; metric keys are compared across runs)
REWARDS = {
    "execution": "sqlrl.train.rewards:build_execution_reward",
    "syntax": "sqlrl.train.rewards:build_syntax_reward",
    "format": "sqlrl.train.rewards:build_format_reward",
}
