"""SQL on real databases: execution under limits, result equality, the EX judge, extraction
from model text, and schema repair. No model code: evaluation, rewards and serving share it."""
