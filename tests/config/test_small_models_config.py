"""configs/small_models.py: every MODEL,ALGORITHM of the anchor grid validates and builds its
method with the model's budget; a wrong spec is one line naming the choices."""

import pytest

from configs.small_models import ALGORITHMS, get_config
from rljax.config import validate_config
from rljax.train.builders import build_algorithm

# Each algorithm on SmolLM2, and Gemma 3 (another budget) once: validation reads a cached
# model's GGUF metadata, seconds for Gemma's 262k-token vocabulary.
CELLS = [("smollm2", a) for a in sorted(ALGORITHMS)] + [("gemma3", "dapo")]


@pytest.mark.parametrize("model,algorithm", CELLS)
def test_the_grid_validates_and_builds(model, algorithm):
    config = validate_config(get_config(f"{model},{algorithm}"))
    assert config.algorithm.name == algorithm and config.task.eval_size == 256
    assert config.run_dir == f"runs/small_models/{model}_{algorithm}"
    if algorithm != "grpo":  # both read the budget: Dr. GRPO's normaliser, DAPO's punishment
        assert config.algorithm.max_len == config.rollout.max_new_tokens
    assert config.rollout.max_refill_rounds == (1 if algorithm == "dapo" else 0)
    build_algorithm(config, vocab_size=262144)


def test_a_wrong_spec_names_the_choices():
    with pytest.raises(ValueError, match=r"MODEL,ALGORITHM.*gemma3.*smollm2.*dapo"):
        get_config("smollm3,grpo")
