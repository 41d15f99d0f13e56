"""Import and export TRM checkpoints in the reference PyTorch `state_dict` format.

The reference implementation saves `model.state_dict()` with `torch.save` (docs/trm.md,
section 8): keys `model.inner.*` (prefixed `_orig_mod.` when the run used torch.compile), torch Linear
weights stored (out, in), H_init/L_init in the run's forward dtype (bfloat16 in the published
recipes; float32 from a run with forward_dtype="float32") and the puzzle-embedding table as
`model.inner.puzzle_emb.weights`. This module maps that format to podlab's
(params, state, puzzle_table) of `modules.trm.TRMModel(config).init(...)` / `.init_puzzle_table()`
and back, bitwise, and runs single ACT steps on imported weights.

Key mapping (block i in 0..L_layers-1; "T" = transposed, torch (out, in) <-> Haiku (in, out)):
  model.inner.embed_tokens.embedding_weight  <->  params["trm/~/embed_tokens"]["embedding"]
  model.inner.embed_pos.embedding_weight     <->  params["trm/~/embed_pos"]["embedding"] (learned)
  model.inner.lm_head.weight                 <->  params["trm/~/lm_head"]["w"] (T)
  model.inner.q_head.weight / .bias          <->  params["trm/~/q_head"]["w"] (T) / ["b"]
  model.inner.L_level.layers.i.<sub>.<proj>.weight
      <->  params["trm/~/L_level/~/layers_i/<sub>/<proj>"]["w"] (T)
      <sub>.<proj>: self_attn.qkv_proj, self_attn.o_proj (attention) or mlp_t.gate_up_proj,
      mlp_t.down_proj (token MLP); mlp.gate_up_proj, mlp.down_proj (both variants)
  model.inner.H_init / L_init (bf16 or f32)  <->  state["trm"]["H_init"] / ["L_init"] (the same dtype:
      kept by default, or cast with init_dtype=...; a float32 or cast pair is logged)
  model.inner.puzzle_emb.weights             <->  puzzle_table [N, E] float32 (absent when E = 0)

Public API:
  load_state_dict(path) -> dict[str, np.ndarray]         torch.load(weights_only=True); needs torch.
  save_state_dict(state_dict, path)                      torch.save of tensors only; needs torch.
  infer_config(state_dict, **overrides) -> TRMConfig     shapes -> config; overrides for the rest.
  reference_key_shapes(config) -> {key: (shape, dtype)}  the exact key set a config expects.
  adam_param_count(state_dict) -> int                    the reference's printed parameter count.
  import_reference(state_dict, config, *, init_dtype=None, log=None) -> (params, state, puzzle_table)
  export_reference(params, state, puzzle_table, config, *, compiled_prefix=False) -> state_dict
  load_reference_checkpoint(path, config) -> (params, state, puzzle_table)
  initial_carry(config, batch) -> ACTCarry               (re-exported from modules.trm)
  act_step(config, params, state, puzzle_table, carry, batch, *, dtype="float32", training=False,
           rng=None) -> (carry, {"logits", "q_halt_logits", "q_continue_logits"})
  ReferenceCheckpointError                               mismatch between a checkpoint and a config.
This module is the API's home; the file format (`load_state_dict`, `save_state_dict`,
`adam_param_count`, the errors) lives in experiments/trm/reference_format.py and the key layout and
config inference (`reference_key_shapes`, `infer_config`) in experiments/trm/reference_layout.py,
both re-exported here.

PyTorch is optional (`pip install 'podlab[torch]'`, i.e. torch==2.13.0); only `load_state_dict`,
`save_state_dict` and the CLI's file reading/writing need it. Everything else takes plain
`dict[str, np.ndarray]` (torch tensors are accepted too and converted).

Synopsis (a notebook; the path is a reference checkpoint, e.g. Sudoku TRM-MLP):

  import jax.numpy as jnp
  from experiments.trm import reference_checkpoint as rc

  sd = rc.load_state_dict("step_65104.pt")                   # {key: np.ndarray}, `_orig_mod.` stripped
  config = rc.infer_config(sd, H_cycles=3, L_cycles=6)       # seq_len/mlp_t/... from the shapes
  params, state, table = rc.import_reference(sd, config)
  batch = {"inputs": jnp.ones((2, config.seq_len), jnp.int32),
           "labels": jnp.full((2, config.seq_len), 2, jnp.int32),
           "puzzle_identifiers": jnp.zeros((2,), jnp.int32)}
  carry = rc.initial_carry(config, batch)
  for _ in range(config.halt_max_steps):                     # evaluation: halt_max_steps ACT steps
    carry, out = rc.act_step(config, params, state, table, carry, batch, dtype="bfloat16")
  predictions = out["logits"].argmax(-1)                     # [2, L]
  sd2 = rc.export_reference(params, state, table, config, compiled_prefix=True)
  rc.save_state_dict(sd2, "/tmp/roundtrip.pt")

Command line:

  python -m experiments.trm.reference_checkpoint inspect CKPT.pt [--num_heads 8 ...]
  python -m experiments.trm.reference_checkpoint import CKPT.pt --out DIR [config overrides]
      [--init_dtype keep|bfloat16|float32]        # H_init/L_init: keep the stored dtype (default)
  python -m experiments.trm.reference_checkpoint export DIR --out CKPT.pt [--compiled_prefix]

`import` writes an orbax PyTree checkpoint {"params", "state", "puzzle_table"} at DIR with the
TRMConfig in its custom metadata ("trm_config"); `export` reads it back (the stored config, updated by
any overrides). Fields that no weight shape reveals (H_cycles, L_cycles, halt_max_steps, num_heads,
halt_exploration_prob, forward_dtype unless H_init/L_init are stored float32; rope vs none without
learned positions) take the TRMConfig defaults unless overridden; seq_len must be given for attention checkpoints without learned
positions (no stored shape holds it).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
from typing import Any, Callable, Dict, Mapping, Optional, Sequence, Tuple

from experiments.common import console

console.quiet_native_logs()     # CLI: before TensorFlow (via checkpointing) and XLA load (its oneDNN notice)

from absl import logging
import haiku as hk
import jax
import jax.numpy as jnp
import numpy as np

from experiments.common import checkpointing
from experiments.common import distributed
from experiments.common import errors
from experiments.trm import reference_format
from experiments.trm import reference_layout
from experiments.trm.reference_format import (COMPILED_PREFIX, INIT_DTYPES, INNER, K_H_INIT,
                                              K_L_INIT, K_TABLE, InputMissing,
                                              ReferenceCheckpointError, StateDict,
                                              adam_param_count, load_state_dict, save_state_dict)
from experiments.trm.reference_layout import NOT_INFERABLE, infer_config, reference_key_shapes
from modules import trm
from modules.trm import ACTCarry, TRMConfig, initial_carry

__all__ = [
    "ACTCarry", "ReferenceCheckpointError", "TRMConfig", "act_step", "adam_param_count",
    "export_reference", "import_reference", "infer_config", "initial_carry",
    "load_reference_checkpoint", "load_state_dict", "main", "reference_key_shapes",
    "save_state_dict",
]


class OutputExists(errors.BadInput, FileExistsError):
  """--out exists and --force was not given (a FileExistsError too)."""


# --------------------------------------------------------------------------------------------------
# Import / export.
# --------------------------------------------------------------------------------------------------


def import_reference(state_dict: Mapping[str, Any], config: TRMConfig, *,
                     init_dtype: Optional[str] = None,
                     log: Optional[Callable[[str], None]] = None
                     ) -> Tuple[hk.Params, hk.State, Optional[jax.Array]]:
  """Reference state_dict -> podlab (params, state, puzzle_table).

  state_dict: {key: np.ndarray or torch.Tensor}, keys with or without `_orig_mod.`.
  Returns params (float32, Linear weights transposed to (in, out)), state {"trm": {H_init, L_init}}
  and the puzzle table [N, E] float32 (None when config.puzzle_emb_ndim == 0), as jnp arrays,
  bitwise equal to the stored values. H_init/L_init are stored in the run's forward dtype (bfloat16,
  or float32 from a forward_dtype="float32" run): `init_dtype` None or "keep" keeps it (podlab's
  model casts them to its compute dtype at use), "bfloat16" / "float32" casts; `log` (default absl
  logging.warning) gets one line when the pair is float32 or is cast (from -> to). Raises
  ReferenceCheckpointError listing every missing, unexpected, mis-shaped or mis-typed key with the
  likely config fix.
  """
  if init_dtype not in (None, "keep") + INIT_DTYPES:
    raise ValueError(f"init_dtype={init_dtype!r}: use 'keep' (None), 'bfloat16' or 'float32'")
  sd = reference_format.normalize(state_dict)
  problems = reference_layout.check(sd, config)
  if problems:
    raise ReferenceCheckpointError(
        f"reference state_dict does not match {reference_layout.config_summary(config)}:\n"
        + "\n".join(problems))
  stored = sd[K_H_INIT].dtype.name
  target = stored if init_dtype in (None, "keep") else init_dtype
  if target != stored:
    (log or logging.warning)(f"H_init/L_init: cast {stored} -> {target} (init_dtype={init_dtype!r})")
  elif stored != "bfloat16":
    (log or logging.warning)(f"H_init/L_init are stored {stored} (a forward_dtype={stored!r} "
                             f"reference run): kept {stored}")
  params: Dict[str, Dict[str, jax.Array]] = {}
  state: Dict[str, Dict[str, jax.Array]] = {}
  table = None
  for e in reference_layout.entries(config):
    value = sd[e.key]
    if e.transpose:
      value = np.ascontiguousarray(value.T)
    if e.group == "params":
      params.setdefault(e.module, {})[e.name] = jnp.asarray(value, dtype=e.dtype)
    elif e.group == "state":
      state.setdefault(e.module, {})[e.name] = jnp.asarray(value, dtype=target)
    else:
      table = jnp.asarray(value, dtype=e.dtype)
  return params, state, table


def _flat_podlab(params: Mapping, state: Mapping) -> Dict[Tuple[str, str, str], np.ndarray]:
  flat = {}
  for group, tree in (("params", params), ("state", state)):
    if not isinstance(tree, Mapping):
      raise ReferenceCheckpointError(f"{group} must be a Haiku mapping {{module: {{name: array}}}}, "
                                     f"got {type(tree).__name__}")
    for module, leaves in tree.items():
      if not isinstance(leaves, Mapping):
        raise ReferenceCheckpointError(f"{group}[{module!r}] must map leaf names to arrays")
      for name, leaf in leaves.items():
        flat[(group, module, name)] = np.asarray(leaf)
  return flat


def export_reference(params: hk.Params, state: hk.State, puzzle_table: Optional[Any],
                     config: TRMConfig, *, compiled_prefix: bool = False) -> StateDict:
  """podlab (params, state, puzzle_table) -> reference state_dict {key: np.ndarray}.

  Exactly the keys of `reference_key_shapes(config)` (prefixed `_orig_mod.` when `compiled_prefix`,
  as torch.compile'd runs save them); float32 weights in torch (out, in) layout, H_init/L_init in
  the state's dtype (bfloat16, or float32 as a forward_dtype="float32" run stores them).
  `import_reference(export_reference(...), config)` gives back the inputs bitwise.
  """
  flat = _flat_podlab(params, state)
  problems = []
  seen = set()
  out: StateDict = {}
  for e in reference_layout.entries(config):
    if e.group == "table":
      if puzzle_table is None:
        problems.append(f"  missing: puzzle_table (expected shape {e.shape} float32; "
                        "config.puzzle_emb_ndim > 0)")
        continue
      value = np.asarray(puzzle_table)
      where = "puzzle_table"
    else:
      where = f"{e.group}[{e.module!r}][{e.name!r}]"
      ident = (e.group, e.module, e.name)
      if ident not in flat:
        problems.append(f"  missing: {where} (for {e.key})")
        continue
      seen.add(ident)
      value = flat[ident]
      if e.transpose:
        value = value.T
    if tuple(value.shape) != e.shape:
      got = tuple(value.shape[::-1]) if e.transpose else tuple(value.shape)
      want = tuple(e.shape[::-1]) if e.transpose else e.shape
      problems.append(f"  wrong shape: {where} expected {want}, got {got}")
      continue
    if e.group == "state" and value.dtype.name in INIT_DTYPES:
      pass                                      # the reference's forward dtype: written as it is
    elif value.dtype != e.dtype:
      want = "bfloat16 or float32" if e.group == "state" else e.dtype.name
      problems.append(f"  wrong dtype: {where} expected {want}, got {value.dtype}")
      continue
    out[(COMPILED_PREFIX if compiled_prefix else "") + e.key] = np.ascontiguousarray(value)
  for ident in sorted(set(flat) - seen):
    problems.append(f"  unexpected: {ident[0]}[{ident[1]!r}][{ident[2]!r}]")
  inits = {k: v.dtype.name for k, v in out.items() if k.endswith((K_H_INIT, K_L_INIT))}
  if len(set(inits.values())) > 1:
    problems.append(f"  mixed dtypes: state H_init/L_init are {sorted(inits.values())} (the "
                    "reference stores both in its forward dtype): cast them to one")
  if puzzle_table is not None and not config.prefix_len:
    problems.append("  unexpected: puzzle_table (config.puzzle_emb_ndim == 0: pass None)")
  if problems:
    raise ReferenceCheckpointError(
        f"podlab trees do not match {reference_layout.config_summary(config)}:\n"
        + "\n".join(problems))
  return out


def load_reference_checkpoint(path: str | os.PathLike, config: TRMConfig
                              ) -> Tuple[hk.Params, hk.State, Optional[jax.Array]]:
  """`import_reference(load_state_dict(path), config)`."""
  return import_reference(load_state_dict(path), config)


# --------------------------------------------------------------------------------------------------
# Running imported weights.
# --------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=32)
def _act_step_fn(config: TRMConfig, training: bool):
  model = trm.TRMModel(config)

  def step(params, state, puzzle_table, carry, batch, rng):
    dt = config.dtype
    carry = carry._replace(z_H=carry.z_H.astype(dt), z_L=carry.z_L.astype(dt))
    return model.act_step(params, state, puzzle_table, carry, batch, training=training, rng=rng)

  return jax.jit(step)


def act_step(config: TRMConfig, params: hk.Params, state: hk.State,
             puzzle_table: Optional[jax.Array], carry: ACTCarry, batch: Mapping[str, Any], *,
             dtype: str = "float32", training: bool = False,
             rng: Optional[jax.Array] = None) -> Tuple[ACTCarry, Dict[str, jax.Array]]:
  """One ACT step of `modules.trm.TRMModel` with the forward dtype chosen here.

  batch: {"inputs": [B, L] int, "labels": [B, L] int, "puzzle_identifiers": [B] int} (the keys of
  `carry.current_data`). carry: an ACTCarry (`initial_carry(config, batch)` to start); its z_H/z_L
  are cast to `dtype`. dtype: "float32" (to compare with a float32 reference) or "bfloat16" (the
  reference's training/eval dtype). training=True applies Q-halting with exploration and needs `rng`.
  Returns (new carry, {"logits" [B, L, V] in dtype, "q_halt_logits" [B], "q_continue_logits" [B]
  float32}). Jitted and cached per (config, dtype, training).
  """
  if dtype not in ("float32", "bfloat16"):
    raise ValueError(f"act_step dtype={dtype!r}: use 'float32' or 'bfloat16'")
  if training and config.halt_max_steps > 1 and rng is None:
    raise ValueError("act_step(training=True) needs rng=jax.random.key(...) for halting exploration")
  fn = _act_step_fn(dataclasses.replace(config, forward_dtype=dtype), bool(training))
  return fn(params, state, puzzle_table, carry, dict(batch), rng)



# --------------------------------------------------------------------------------------------------
# Command line.
# --------------------------------------------------------------------------------------------------


def _parse_bool(text: str) -> bool:
  low = text.lower()
  if low in ("1", "true", "yes", "y", "on"):
    return True
  if low in ("0", "false", "no", "n", "off"):
    return False
  raise argparse.ArgumentTypeError(f"expected a boolean (true/false), got {text!r}")


def _parse_optional_int(text: str) -> Optional[int]:
  return None if text.lower() in ("none", "null") else int(text)


_FIELD_PARSERS = {"int": int, "float": float, "str": str, "bool": _parse_bool,
                  "Optional[int]": _parse_optional_int}


def _add_config_flags(parser: argparse.ArgumentParser) -> None:
  group = parser.add_argument_group(
      "TRMConfig overrides (fields no weight shape reveals - " + ", ".join(NOT_INFERABLE) +
      " - take the TRMConfig defaults unless given; seq_len is required for attention checkpoints "
      "without learned positions; rope vs none cannot be told apart)")
  for f in dataclasses.fields(TRMConfig):
    parse = _FIELD_PARSERS.get(str(f.type))
    if parse is None:
      raise TypeError(f"TRMConfig.{f.name} has type {f.type!r}: add a parser in {__name__}")
    default = "" if f.default is dataclasses.MISSING else f"; TRMConfig default {f.default!r}"
    if f.name == "forward_dtype":
      note = f"'float32' when H_init/L_init are stored float32, else not inferable{default}"
    elif f.name in NOT_INFERABLE:
      note = f"not inferable{default}"
    elif f.name == "seq_len":
      note = "inferred as S - prefix for mlp_t or learned positions; required otherwise"
    elif f.name == "pos_encodings":
      note = "'learned' when embed_pos is stored; else 'none' for mlp_t, 'rope' for attention"
    elif f.name == "puzzle_emb_len":
      note = f"prefix slots P, not stored{default}"
    else:
      note = "inferred from the shapes"
    group.add_argument(f"--{f.name}", type=parse, default=argparse.SUPPRESS,
                       help=f"TRMConfig.{f.name}: {note}")


def _overrides(args: argparse.Namespace) -> Dict[str, Any]:
  names = {f.name for f in dataclasses.fields(TRMConfig)}
  return {k: v for k, v in vars(args).items() if k in names}


def _inspect(args: argparse.Namespace) -> int:
  sd = load_state_dict(args.checkpoint)
  print(f"checkpoint: {args.checkpoint}")
  print(f"keys ({len(sd)}):")
  width = max(len(k) for k in sd) if sd else 0
  for k in sorted(sd):
    print(f"  {k:<{width}}  {str(tuple(sd[k].shape)):<14} {sd[k].dtype}")
  overrides = _overrides(args)
  fields = reference_layout.infer_fields(sd, overrides.get("puzzle_emb_len", 16))
  print("inferred from the shapes:")
  for name, (value, reason) in fields.items():
    print(f"  {name}={value!r}  ({reason})")
  count = adam_param_count(sd)
  published = reference_format.PUBLISHED_PARAM_COUNTS.get(count)
  print(f"Adam parameters: {count:,}" +
        (f" (= the published {published} count)" if published else ""))
  if K_TABLE in sd:
    print(f"puzzle-embedding table: {tuple(sd[K_TABLE].shape)} (not an Adam parameter)")
  if K_H_INIT in sd:
    print(f"H_init/L_init: {sd[K_H_INIT].dtype} (the reference run's forward dtype; `import` keeps "
          "it unless --init_dtype)")
  try:
    config = infer_config(sd, **overrides)
  except ReferenceCheckpointError as e:
    print(f"config: not complete: {e}")
    return 1
  print(f"config (inferred + overrides): {config}")
  print("not inferable (defaults unless overridden): " +
        ", ".join(f"{n}={getattr(config, n)!r}" for n in NOT_INFERABLE))
  problems = reference_layout.check(sd, config)
  if problems:
    print("does NOT match that config:\n" + "\n".join(problems))
    return 1
  print("matches that config: importable")
  return 0


def _import(args: argparse.Namespace) -> int:
  sd = load_state_dict(args.checkpoint)
  config = infer_config(sd, **_overrides(args))
  params, state, table = import_reference(
      sd, config, init_dtype=args.init_dtype,
      log=lambda line: print(f"reference_checkpoint import: {line}", file=sys.stderr))
  out = os.path.abspath(args.out)
  if os.path.exists(out) and not args.force:
    raise OutputExists(f"--out={out} exists. Fix: choose a new directory or pass --force")
  tree = {"params": params, "state": state, "puzzle_table": table}
  checkpointing.write_tree(out, tree, force=args.force,
                           metadata={"trm_config": dataclasses.asdict(config),
                                     "source": os.path.abspath(args.checkpoint)})
  print(f"wrote podlab params/state/puzzle_table to {out} ({adam_param_count(sd):,} Adam "
        f"parameters)\nconfig: {config}")
  return 0


def _restore_podlab(directory: str) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
  if not os.path.isdir(directory):
    raise InputMissing(f"podlab checkpoint directory {directory!r} does not exist. Fix: pass the "
                       "--out directory of `reference_checkpoint import`")
  tree, custom = checkpointing.read_tree(directory, with_metadata=True)
  return tree, custom.get("trm_config")


def _export(args: argparse.Namespace) -> int:
  tree, stored = _restore_podlab(os.path.abspath(args.checkpoint))
  for item in ("params", "state"):
    if item not in tree:
      raise ReferenceCheckpointError(f"{args.checkpoint}: no {item!r} item (items: {sorted(tree)}): "
                                     "expected what `import` writes")
  table = tree.get("puzzle_table")
  overrides = _overrides(args)
  if stored is not None:
    config = TRMConfig(**{**stored, **overrides})
  else:                                                   # no stored config: infer from the shapes
    flat = {}
    for (group, module, name), value in _flat_podlab(tree["params"], tree["state"]).items():
      key, transpose = ((INNER + name, False) if group == "state"
                        else reference_layout.reference_key(module, name))
      flat[key] = value.T if transpose else value
    if table is not None:
      flat[K_TABLE] = np.asarray(table)
    config = infer_config(flat, **overrides)
  sd = export_reference(tree["params"], tree["state"], table, config,
                        compiled_prefix=args.compiled_prefix)
  save_state_dict(sd, args.out)
  count = adam_param_count(sd)
  print(f"wrote {len(sd)} tensors ({count:,} Adam parameters) to {args.out}\nconfig: {config}")
  return 0


def _parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(
      prog="python -m experiments.trm.reference_checkpoint",
      description="Inspect, import or export TRM checkpoints in the reference PyTorch format.")
  sub = parser.add_subparsers(dest="command", required=True)
  p = sub.add_parser("inspect", help="print keys/shapes, the inferred config and the parameter count")
  p.add_argument("checkpoint", help="reference checkpoint (.pt state_dict)")
  _add_config_flags(p)
  p = sub.add_parser("import", help="reference .pt -> podlab orbax PyTree checkpoint directory")
  p.add_argument("checkpoint", help="reference checkpoint (.pt state_dict)")
  p.add_argument("--out", required=True, help="output directory (orbax PyTree checkpoint)")
  p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
  p.add_argument("--init_dtype", choices=("keep",) + INIT_DTYPES, default="keep",
                 help="H_init/L_init: keep the stored dtype (the run's forward dtype; default) or "
                 "cast (logged)")
  _add_config_flags(p)
  p = sub.add_parser(
      "export", help="podlab orbax directory (from `import`) -> reference .pt",
      description="Writes a reference .pt from a podlab orbax directory. The TRMConfig stored by "
      "`import` is used (flags below replace its fields); without one it is inferred from the shapes.")
  p.add_argument("checkpoint", help="podlab orbax PyTree checkpoint directory")
  p.add_argument("--out", required=True, help="output .pt file")
  p.add_argument("--compiled_prefix", action="store_true",
                 help="prefix keys with `_orig_mod.` as torch.compile'd reference runs do")
  _add_config_flags(p)
  return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
  """CLI entry point; returns the exit status: 0, or errors.exit_code (2 for bad input) with one
  `error:` line (any other exception is a bug and keeps its traceback). argv excludes the program
  name."""
  distributed.choose_platforms()     # off a TPU VM: the CPU, no libtpu probe (and its warnings)
  args = _parser().parse_args(argv)
  command = {"inspect": _inspect, "import": _import, "export": _export}[args.command]
  try:
    return command(args)
  except errors.USER_ERRORS as e:
    print(f"error: reference_checkpoint {args.command}: {e}", file=sys.stderr)
    return errors.exit_code(e)


if __name__ == "__main__":
  sys.exit(main())
