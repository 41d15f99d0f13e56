"""Safetensors read/write without torch and without pickle: header + raw bytes, memory-mapped reads.

The format (huggingface/safetensors): an 8-byte little-endian header length N, N bytes of JSON
{name: {"dtype": "BF16", "shape": [...], "data_offsets": [begin, end]}, "__metadata__": {...}},
then the raw little-endian tensor bytes (offsets relative to the byte after the header). Sharded
checkpoints add `model.safetensors.index.json` {"metadata": {...}, "weight_map": {name: shard file}}.

Reading maps each tensor with `np.memmap` (read-only, nothing is loaded until touched), so a converter
holds at most the tensors it is working on; bfloat16 is `ml_dtypes.bfloat16`. Every problem (bad
header, truncated shard, offsets that do not match the shape, unknown dtype, a tensor the index names
but the shard lacks) raises `SafetensorsError` naming the file, the tensor and the fix.

Shape glossary: none (tensors keep their stored shapes; torch Linear weights are [out, in]).

Synopsis:

  import os, tempfile
  import ml_dtypes, numpy as np
  from experiments.common import safetensors_io as st

  d = tempfile.mkdtemp()
  tensors = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3),
             "b.bias": np.ones(4, ml_dtypes.bfloat16)}
  st.write_safetensors(os.path.join(d, "model.safetensors"), tensors)
  f = st.SafetensorsFile(os.path.join(d, "model.safetensors"))
  assert f.infos["b.bias"].dtype_name == "BF16" and f.get("a.weight")[1, 2] == 5.0
  specs = [(name, t.shape, t.dtype) for name, t in tensors.items()]
  st.write_sharded(d, specs, tensors.__getitem__, max_shard_bytes=16)   # 2 shards + index json
  ckpt = st.ShardedCheckpoint(d)
  assert sorted(ckpt.infos) == ["a.weight", "b.bias"] and len(ckpt.files) == 2
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import ml_dtypes
import numpy as np

from experiments.common import errors

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024           # the safetensors library's own limit

DTYPES: Dict[str, np.dtype] = {
    "BF16": np.dtype(ml_dtypes.bfloat16), "F16": np.dtype(np.float16),
    "F32": np.dtype(np.float32), "F64": np.dtype(np.float64),
    "I8": np.dtype(np.int8), "I16": np.dtype(np.int16), "I32": np.dtype(np.int32),
    "I64": np.dtype(np.int64), "U8": np.dtype(np.uint8), "U16": np.dtype(np.uint16),
    "U32": np.dtype(np.uint32), "U64": np.dtype(np.uint64), "BOOL": np.dtype(np.bool_),
}
DTYPE_NAMES: Dict[np.dtype, str] = {v: k for k, v in DTYPES.items()}


class SafetensorsError(errors.FormatError):
  """A malformed, truncated or inconsistent safetensors file or index; the message says which."""


def dtype_name(dtype) -> str:
  """numpy dtype -> safetensors dtype string ("BF16", "F32", ...)."""
  dt = np.dtype(dtype)
  if dt not in DTYPE_NAMES:
    raise SafetensorsError(f"dtype {dt} has no safetensors name; use one of {sorted(DTYPES)}")
  return DTYPE_NAMES[dt]


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  """Where one tensor lives: file, dtype, shape and its byte range in the file."""
  name: str
  path: str
  dtype_name: str
  shape: Tuple[int, ...]
  offset: int                  # absolute byte offset in the file
  nbytes: int

  @property
  def dtype(self) -> np.dtype:
    return DTYPES[self.dtype_name]


class SafetensorsFile:
  """One .safetensors file: a validated header (`infos`, `metadata`) and memory-mapped tensors.

  Validation on open: header length within the file, JSON object, known dtypes, integer shapes,
  offsets that equal prod(shape) * itemsize, tile the data section without gaps or overlaps and end
  exactly at the end of the file (a truncated or padded file is an error).
  """

  def __init__(self, path: str):
    self.path = os.fspath(path)
    try:
      size = os.path.getsize(self.path)
    except OSError as e:
      raise SafetensorsError(f"{self.path}: cannot open ({e.strerror}). Fix: check the path") from None
    with open(self.path, "rb") as f:
      head = f.read(8)
      if len(head) < 8:
        raise SafetensorsError(f"{self.path}: {size} bytes, too short for a safetensors header "
                               "(8-byte length + JSON). Fix: re-download this shard")
      (n,) = struct.unpack("<Q", head)
      if n > min(MAX_HEADER_BYTES, size - 8):
        raise SafetensorsError(
            f"{self.path}: header length {n} exceeds the file ({size} bytes) or the "
            f"{MAX_HEADER_BYTES}-byte limit: not a safetensors file, or truncated. "
            "Fix: re-download this shard")
      raw = f.read(n)
    try:
      header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise SafetensorsError(f"{self.path}: header is not valid JSON ({e}). Fix: re-download this "
                             "shard") from None
    if not isinstance(header, dict):
      raise SafetensorsError(f"{self.path}: header is a JSON {type(header).__name__}, not an object")
    self.metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + n
    data_len = size - data_start
    self.infos: Dict[str, TensorInfo] = {}
    spans = []
    for name, entry in header.items():
      where = f"{self.path}: tensor {name!r}"
      if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise SafetensorsError(f"{where}: header entry {entry!r} lacks dtype/shape/data_offsets")
      dt, shape, offs = entry["dtype"], entry["shape"], entry["data_offsets"]
      if dt not in DTYPES:
        raise SafetensorsError(f"{where}: unsupported dtype {dt!r}; supported: {sorted(DTYPES)}")
      if (not isinstance(shape, list) or
          not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape)):
        raise SafetensorsError(f"{where}: bad shape {shape!r} (a list of non-negative ints)")
      if (not isinstance(offs, list) or len(offs) != 2 or
          not all(isinstance(o, int) and o >= 0 for o in offs) or offs[1] < offs[0]):
        raise SafetensorsError(f"{where}: bad data_offsets {offs!r}")
      nbytes = int(np.prod(shape, dtype=np.int64)) * DTYPES[dt].itemsize
      if offs[1] - offs[0] != nbytes:
        raise SafetensorsError(f"{where}: data_offsets {offs} hold {offs[1] - offs[0]} bytes but "
                               f"{dt} {shape} needs {nbytes}. Fix: re-download this shard")
      spans.append((offs[0], offs[1], name))
      self.infos[name] = TensorInfo(name, self.path, dt, tuple(shape), data_start + offs[0], nbytes)
    spans.sort()
    end = 0
    for begin, stop, name in spans:
      if begin != end:
        raise SafetensorsError(f"{self.path}: tensor {name!r} starts at data byte {begin}, expected "
                               f"{end} (a gap or an overlap): corrupt header")
      end = stop
    if end != data_len:
      what = "truncated" if end > data_len else "has trailing bytes"
      raise SafetensorsError(f"{self.path}: {what}: the header describes {end} data bytes, the file "
                             f"holds {data_len}. Fix: re-download this shard")

  def keys(self) -> List[str]:
    return list(self.infos)

  def get(self, name: str) -> np.ndarray:
    """The tensor as a read-only np.memmap (no copy; pages load on first touch)."""
    if name not in self.infos:
      raise SafetensorsError(f"{self.path}: no tensor {name!r}")
    return read_tensor(self.infos[name])


def read_tensor(info: TensorInfo) -> np.ndarray:
  """A read-only memory map of one tensor (an empty array for zero-size tensors)."""
  if info.nbytes == 0:
    return np.zeros(info.shape, info.dtype)
  return np.memmap(info.path, dtype=info.dtype, mode="r", offset=info.offset, shape=info.shape)


class ShardedCheckpoint:
  """A Hugging Face checkpoint folder: `model.safetensors.index.json` + shards, or one
  `model.safetensors`. `infos` maps every tensor name to its TensorInfo across all shards.

  Checks: every shard the index names exists and is valid, every tensor the index names is in the
  shard it names, no tensor appears in two shards, and no shard holds a tensor the index omits.
  """

  def __init__(self, hf_dir: str):
    self.dir = os.fspath(hf_dir)
    index_path = os.path.join(self.dir, INDEX_NAME)
    single = os.path.join(self.dir, SINGLE_NAME)
    if os.path.isfile(index_path):
      try:
        with open(index_path) as f:
          index = json.load(f)
        weight_map = index["weight_map"]
        assert isinstance(weight_map, dict)
      except (OSError, ValueError, KeyError, AssertionError) as e:
        raise SafetensorsError(f"{index_path}: not a valid index (needs a JSON object with a "
                               f"'weight_map' object; {type(e).__name__}: {e})") from None
      self.metadata = index.get("metadata", {}) or {}
    elif os.path.isfile(single):
      weight_map = None
      self.metadata = {}
    else:
      raise SafetensorsError(f"{self.dir}: neither {INDEX_NAME} nor {SINGLE_NAME} found. Fix: pass "
                             "the folder that holds the checkpoint's .safetensors files")
    shard_names = sorted(set(weight_map.values())) if weight_map is not None else [SINGLE_NAME]
    self.files: Dict[str, SafetensorsFile] = {}
    for shard in shard_names:
      path = os.path.join(self.dir, shard)
      if not os.path.isfile(path):
        listed = sorted(n for n, s in weight_map.items() if s == shard)
        raise SafetensorsError(f"{path}: shard named by the index (for {len(listed)} tensors, e.g. "
                               f"{listed[0]!r}) is missing. Fix: download all shards")
      self.files[shard] = SafetensorsFile(path)
    self.infos: Dict[str, TensorInfo] = {}
    for shard, f in self.files.items():
      for name, info in f.infos.items():
        if name in self.infos:
          raise SafetensorsError(f"tensor {name!r} is in two shards: {self.infos[name].path} and "
                                 f"{info.path}")
        if weight_map is not None and weight_map.get(name) != shard:
          where = (f"maps it to {weight_map[name]!r}" if name in weight_map else "does not list it")
          raise SafetensorsError(f"{f.path}: holds tensor {name!r} but the index {where}. Fix: use "
                                 "the index that came with these shards")
        self.infos[name] = info
    if weight_map is not None:
      for name, shard in weight_map.items():
        if name not in self.infos:
          raise SafetensorsError(f"{os.path.join(self.dir, shard)}: the index says it holds "
                                 f"{name!r}, the shard does not. Fix: re-download this shard")

  def get(self, name: str) -> np.ndarray:
    if name not in self.infos:
      raise SafetensorsError(f"{self.dir}: no tensor {name!r}")
    return read_tensor(self.infos[name])

  @property
  def total_bytes(self) -> int:
    return sum(i.nbytes for i in self.infos.values())


def _header_bytes(entries: Sequence[Tuple[str, Sequence[int], np.dtype]],
                  metadata: Optional[Mapping[str, str]]) -> Tuple[bytes, List[int]]:
  header, offset, sizes = {}, 0, []
  if metadata:
    header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
  for name, shape, dtype in entries:
    dt = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    header[name] = {"dtype": dtype_name(dt), "shape": [int(s) for s in shape],
                    "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
    sizes.append(nbytes)
  raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
  raw += b" " * (-len(raw) % 8)                         # pad to 8 bytes, as the library does
  return struct.pack("<Q", len(raw)) + raw, sizes


def _write_file(path: str, entries: Sequence[Tuple[str, Sequence[int], np.dtype]],
                make: Callable[[str], np.ndarray], metadata: Optional[Mapping[str, str]]) -> None:
  head, sizes = _header_bytes(entries, metadata)
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(head)
    for (name, shape, dtype), nbytes in zip(entries, sizes):
      arr = np.asarray(make(name))
      if arr.shape != tuple(shape) or arr.dtype != np.dtype(dtype):
        raise SafetensorsError(f"{path}: tensor {name!r} was declared {np.dtype(dtype)} "
                               f"{tuple(shape)} but produced {arr.dtype} {arr.shape}")
      f.write(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())
      del arr
  os.replace(tmp, path)


def write_safetensors(path: str, tensors: Mapping[str, np.ndarray],
                      metadata: Optional[Mapping[str, str]] = None) -> None:
  """Writes one .safetensors file from in-memory arrays (names in the given order)."""
  entries = [(name, np.shape(t), np.asarray(t).dtype) for name, t in tensors.items()]
  _write_file(os.fspath(path), entries, lambda name: tensors[name], metadata)


def write_sharded(out_dir: str, specs: Iterable[Tuple[str, Sequence[int], np.dtype]],
                  make: Callable[[str], np.ndarray], *, max_shard_bytes: Optional[int] = None,
                  num_shards: Optional[int] = None,
                  metadata: Optional[Mapping[str, str]] = None) -> List[str]:
  """Writes shards `model-0000i-of-0000n.safetensors` + the index json, streaming tensor by tensor.

  specs: (name, shape, dtype) in checkpoint order. Either `max_shard_bytes` (a new shard starts when
  the next tensor would push the current one past it; a larger tensor gets a shard of its own) or
  `num_shards` (contiguous runs of about equal bytes; fewer only if huge tensors leave one empty).
  make(name) -> the array, called once per tensor while its shard is written (so a random model of
  any size is written holding one tensor at a time). Returns the shard file names.
  """
  if (max_shard_bytes is None) == (num_shards is None):
    raise ValueError("write_sharded: pass exactly one of max_shard_bytes and num_shards")
  specs = [(n, tuple(int(s) for s in shape), np.dtype(dt)) for n, shape, dt in specs]
  sizes = [int(np.prod(shape, dtype=np.int64)) * dt.itemsize for _, shape, dt in specs]
  groups: List[List[Tuple[str, Tuple[int, ...], np.dtype]]] = [[]]
  if num_shards is not None:
    total, start = max(sum(sizes), 1), 0
    buckets: List[list] = [[] for _ in range(num_shards)]
    for spec, nbytes in zip(specs, sizes):
      buckets[min(num_shards - 1, start * num_shards // total)].append(spec)
      start += nbytes
    groups = [b for b in buckets if b] or [[]]
  else:
    used = 0
    for spec, nbytes in zip(specs, sizes):
      if groups[-1] and used + nbytes > max_shard_bytes:
        groups.append([])
        used = 0
      groups[-1].append(spec)
      used += nbytes
  os.makedirs(out_dir, exist_ok=True)
  names = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
  weight_map, total = {}, 0
  for shard, group in zip(names, groups):
    _write_file(os.path.join(out_dir, shard), group, make, {"format": "pt"})
    for name, shape, dt in group:
      weight_map[name] = shard
      total += int(np.prod(shape, dtype=np.int64)) * dt.itemsize
  meta = {"total_size": total}
  meta.update(metadata or {})
  with open(os.path.join(out_dir, INDEX_NAME), "w") as f:
    json.dump({"metadata": meta, "weight_map": weight_map}, f, indent=2)
  return names
