"""Evaluation: EX/EM on a split, self-consistency voting, the scorer and Spider's official EM
(spider_eval), the paired bootstrap between models, and the review report."""
