"""Prints the Adam-parameter counts of the reference TRM configurations, computed from the model code.

  python -m experiments.trm.tools.params          # or: make params

Counts come from `jax.eval_shape` of `modules.trm.TRMModel.init` (no memory is allocated) and exclude
the puzzle-embedding table, as the reference's printed counts do; the published counts are shown beside.
"""

import jax

from experiments.common import distributed
from modules import trm

# name: (TRMConfig fields, published count)
REFERENCE_CONFIGS = {
    "TRM-MLP Sudoku": (dict(seq_len=81, vocab_size=11, mlp_t=True, pos_encodings="none"), 5_028_866),
    "TRM-Att Sudoku": (dict(seq_len=81, vocab_size=11), 6_828_034),
    "TRM-Att Maze": (dict(seq_len=900, vocab_size=6, L_cycles=4), 6_822_914),
    "TRM-Att ARC": (dict(seq_len=900, vocab_size=12, L_cycles=4), 6_829_058),
    "TRM-MLP Maze": (dict(seq_len=900, vocab_size=6, mlp_t=True, pos_encodings="none"), 18_795_522),
    "TRM-MLP ARC": (dict(seq_len=900, vocab_size=12, mlp_t=True, pos_encodings="none"), 18_801_666),
}


def count(fields) -> int:
  params, _ = jax.eval_shape(trm.TRMModel(trm.TRMConfig(**fields)).init, jax.random.key(0))
  return trm.adam_param_count(params)


def table() -> str:
  rows = [("config", "podlab", "reference", "match")]
  for name, (fields, published) in REFERENCE_CONFIGS.items():
    n = count(fields)
    rows.append((name, f"{n:,}", f"{published:,}", "yes" if n == published else "NO"))
  widths = [max(len(r[i]) for r in rows) for i in range(4)]
  return "\n".join("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths)))
                   for r in rows)


if __name__ == "__main__":
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  print(table())
