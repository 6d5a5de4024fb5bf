"""A tiny TFDS builder for the TFDS task tests: GSM8K-style word problems under other column
names (problem, solution), an integer id and a sequence of texts (MBPP-style asserts).

TFDS finds a builder's files from its module's package directory, so it lives in a package
(a builder defined in a test module or a script fails to prepare).
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

SPLITS = {"train": 30, "test": 6}


def row(i: int) -> dict:
    """Row `i` of the data set, as a JSONL line of it would hold it."""
    return {
        "id": i,
        "problem": f"Ann has {i} pens and buys {i + 2}. How many?",
        "solution": f"{i} + {i + 2} = {2 * i + 2}\n#### {2 * i + 2}",
        "checks": [f"assert f({i}) == {2 * i + 2}", "assert True"],
    }


class TinyTfds(tfds.core.GeneratorBasedBuilder):
    """`row(i)` for i in 0..29 (train) and 100..105 (test)."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self) -> tfds.core.DatasetInfo:
        features = {
            "id": np.int64,
            "problem": tfds.features.Text(),
            "solution": tfds.features.Text(),
            "checks": tfds.features.Sequence(tfds.features.Text()),
        }
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(features))

    def _split_generators(self, dl_manager):
        return {
            "train": self._generate_examples(range(SPLITS["train"])),
            "test": self._generate_examples(range(100, 100 + SPLITS["test"])),
        }

    def _generate_examples(self, ids):
        for i in ids:
            yield i, row(i)
