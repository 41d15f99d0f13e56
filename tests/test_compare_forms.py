"""`python -m experiments.trm.tools.compare_forms`: podlab's TRM step compiled with several CPU-form
lists and timed in alternating rounds. Checks the variants, the table's invariants and that the forms
agree numerically (times are printed, never asserted)."""
import pytest

from experiments.trm.tools import compare_forms


# ~21 s (two compiles of TRM-Att at hidden 32); @slow to keep `make test` under 15 minutes.
@pytest.mark.slow
def test_two_variants_alternate_and_agree():
  args = compare_forms.parse_args(["--quick", "--model=att", "--rounds=2", "--forms=all",
                                   "--forms=fast_grad,unroll,split_reduce", "--warmup=1"])
  assert (args.hidden, args.batch, args.rounds) == (32, 4, 2)
  rows = compare_forms.compare(args)
  assert [r["forms"] for r in rows] == ["all", "fast_grad,unroll,split_reduce"]
  for r in rows:
    assert 0 < r["p10"] <= r["ms"] <= r["p90"]
    assert r["temp_GB"] > 0 and r["rounds"] == 2
  assert rows[0]["won"] is None and rows[0]["vs_first"] == 0.0
  assert 0 <= rows[1]["won"] <= 2
  assert rows[1]["vs_first"] == pytest.approx(rows[1]["ms"] / rows[0]["ms"] - 1.0)
  # head_major is the only difference: the same step to float32 rounding (the same data and
  # starting weights, five steps each: one warm-up, then two rounds of two).
  assert rows[1]["lm_loss"] == pytest.approx(rows[0]["lm_loss"], rel=1e-4)
  table = compare_forms.format_table(rows).splitlines()
  assert table[0].startswith("| forms | ms | p10 | p90 | vs_first | won |")
  assert len(table) == 4 and table[3].startswith("| fast_grad,unroll,split_reduce | ")


@pytest.mark.parametrize("argv, message", [
    (["--forms=all,bogus"], "unknown form"),
    (["--forms=all", "--forms=all"], "given twice"),
    (["--rounds=0"], "must be >= 1"),
    (["--model=demo", "--hidden=32"], "--hidden is for the recipes"),
    (["--forms=all/slice=2"], "slices=N"),
    (["--forms=all/slices=0"], "slices=N"),
    (["--warmup=-1"], "0 or more untimed steps"),
])
def test_bad_flags_name_the_flag_and_the_fix(argv, message, capsys):
  with pytest.raises(SystemExit):
    compare_forms.parse_args(argv)
  assert message in capsys.readouterr().err


def test_quick_narrows_only_the_flags_not_given():
  a = compare_forms.parse_args(["--quick"])
  assert (a.model, a.hidden, a.batch, a.rounds, a.forms, a.warmup) == (
      "att", 32, 4, 2, ["all", "none"], 0)
  a = compare_forms.parse_args(["--quick", "--batch=8", "--rounds=3", "--forms=head_major",
                                "--warmup=1"])
  assert (a.hidden, a.batch, a.rounds, a.forms, a.warmup) == (32, 8, 3, ["head_major"], 1)
  assert compare_forms.parse_args([]).warmup == 2


def test_a_variant_may_name_batch_slices():
  assert compare_forms.split_variant("all") == ("all", 0)            # automatic
  assert compare_forms.split_variant("fast_grad,unroll/slices=4") == ("fast_grad,unroll", 4)
  a = compare_forms.parse_args(["--quick", "--forms=all", "--forms=all/slices=2"])
  assert a.forms == ["all", "all/slices=2"]
