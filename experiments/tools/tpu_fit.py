"""When a program does not fit its TPU slice: the first fix that fits, the largest batch that fits.

- `first_fitting(variants)`: compiles `(label, flags, compile_fn)` fixes in order until one fits;
  `format_variants(tried)` lists them with their HBM need.
- `search_batch(compile_at, lo, hi)`: the largest per-device batch whose program fits.

Each compile gives a `tpu_report.Report` (experiments/tools/dry_run.py's `--dry_run` and
`--search_batch` build the variants and the compile functions).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, List, Optional, Sequence, Tuple

from experiments.tools import tpu_report
from experiments.tools import tpu_target


@dataclasses.dataclass
class Variant:
  """One candidate fix tried by `first_fitting`: its label, the flags that select it, its report."""
  label: str
  flags: str
  report: tpu_report.Report


def first_fitting(variants: Sequence[Tuple[str, str, Callable[[], tpu_report.Report]]]
                  ) -> Tuple[Optional[Variant], List[Variant]]:
  """Compiles `(label, flags_to_copy, compile_fn)` variants in order until one fits.

  Returns (the first that fits or None, every variant tried with its report), e.g. variants
  [("as configured", "", f0), ("remat", "--config.remat=True", f1), ("half batch", "...", f2)].
  """
  tried: List[Variant] = []
  for label, flags, compile_fn in variants:
    variant = Variant(label, flags, compile_fn())
    tried.append(variant)
    if variant.report.fits:
      return variant, tried
  return None, tried


def format_variants(tried: Sequence[Variant]) -> str:
  """One line per tried variant: HBM need per device against usable, fits, the flags to copy."""
  lines = []
  for v in tried:
    r = v.report
    need = r.need_bytes
    need_text = "?" if need is None else f"{need / tpu_target.GIB:.2f} GiB"
    if not r.compiled and need is not None:
      need_text = ">=" + need_text
    verdict = "fits" if r.fits else "does not fit"
    flags = f": {v.flags}" if v.flags else ""
    usable = r.target.usable_hbm_bytes_per_device / tpu_target.GIB
    lines.append(f"  {v.label}: {need_text} of {usable:.2f} GiB per {r.target.device_noun}, "
                 f"{verdict}{flags}")
  return "\n".join(lines)


@dataclasses.dataclass
class BatchSearch:
  """`search_batch`'s result: the largest fitting batch (None if even `lo` does not fit), its
  report, and every (batch, report) compiled on the way."""
  batch: Optional[int]
  report: Optional[tpu_report.Report]
  tried: List[Tuple[int, tpu_report.Report]]


def search_batch(compile_at: Callable[[int], tpu_report.Report], lo: int, hi: int,
                 multiple_of: int = 1) -> BatchSearch:
  """The largest per-device batch in [lo, hi] (a multiple of `multiple_of`) whose program fits.

  Assumes that a batch fits when a larger one does (HBM grows with the batch). Probes lo and hi,
  then alternates a linear interpolation of the HBM need between the bracket's ends (memory is close
  to linear in the batch, so it usually lands next to the answer) with bisection (which bounds the
  number of compiles by log2 of the range).
  """
  m = int(multiple_of)
  if m < 1:
    raise ValueError(f"multiple_of must be >= 1, got {multiple_of}")
  lo = -(-int(lo) // m) * m
  hi = int(hi) // m * m
  if lo < m or hi < lo:
    raise ValueError(f"no multiple of {m} in the batch range [{lo}, {hi}]")
  tried: List[Tuple[int, tpu_report.Report]] = []

  def probe(b: int) -> tpu_report.Report:
    r = compile_at(b)
    tried.append((b, r))
    return r

  good_r = probe(lo)
  if not good_r.fits:
    return BatchSearch(None, None, tried)
  good = lo
  if hi == lo:
    return BatchSearch(lo, good_r, tried)
  bad_r = probe(hi)
  if bad_r.fits:
    return BatchSearch(hi, bad_r, tried)
  bad = hi
  interpolate = True
  while bad - good > m:
    b = None
    limit = good_r.target.usable_hbm_bytes_per_device
    n_good, n_bad = good_r.need_bytes, bad_r.need_bytes
    if interpolate and n_good is not None and n_bad is not None and n_bad > n_good:
      slope = (n_bad - n_good) / (bad - good)
      b = int((good + (limit - n_good) / slope) // m * m)
      b = min(max(b, good + m), bad - m)
    if b is None:
      b = (good + bad) // 2 // m * m
      b = min(max(b, good + m), bad - m)
    interpolate = not interpolate
    r = probe(b)
    if r.fits:
      good, good_r = b, r
    else:
      bad, bad_r = b, r
  return BatchSearch(good, good_r, tried)
