"""GDPO on a task's reward components through the driver: the collector scores them beside the
reward, they reach the batch as [B, K] and are logged; configs that cannot work are refused."""

import re
from typing import Any

import numpy as np
import pytest
from launching import tiny_driver_run

from configs.gdpo_addition import get_config
from configs.gprl_addition import get_config as gprl_config
from configs.grpo_countdown import get_config as countdown_config
from rljax.data.tasks import AdditionTask
from rljax.models.tokenizer import ByteTokenizer
from rljax.train.collector import Collection, Collector
from rljax.train.loop import train
from rljax.train.scoring import TaskReward, TaskRewardComponents


class Recording:
    """A collector that keeps every batch it hands the trainer."""

    def __init__(self, inner: Collector):
        self.inner, self.batches = inner, []

    def collect(self, state, step: int) -> Collection:
        collection = self.inner.collect(state, step)
        self.batches += collection.fresh
        return collection

    def state(self) -> dict[str, Any]:
        return self.inner.state()

    def load(self, state: dict[str, Any]) -> None:
        self.inner.load(state)


def tiny_config(tmp_path):
    return tiny_driver_run(get_config(), tmp_path / "run")


def test_the_batch_holds_the_task_components_of_each_completion(tmp_path):
    config = tiny_config(tmp_path)
    made = []
    records = {
        r["step"]: r
        for r in train(config, wrap_collector=lambda c: made.append(Recording(c)) or made[0])
    }
    task, tokenizer = AdditionTask(max_digits=config.task.max_digits), ByteTokenizer()
    for batch in made[0].batches:
        rows = batch.rows
        assert rows["reward_components"].shape == (16, 3)
        for i in range(16):  # the task's components of the decoded completion, recomputed
            keep = rows["completion_mask"][i]
            text = tokenizer.decode([int(t) for t in rows["completion_tokens"][i][keep]])
            answer = task.example(int(rows["prompt_id"][i]), "train")["answer"]
            np.testing.assert_allclose(
                rows["reward_components"][i], task.reward_components(text, answer), atol=1e-6
            )
        np.testing.assert_array_equal(rows["reward_components"][:, 0], rows["rewards"])
    for step in (1, 2):
        r = records[step]
        assert r["reward/correct"] == pytest.approx(r["reward/mean"])
        assert 0.0 <= r["reward/digits"] <= 1.0 and 0.0 <= r["reward/length"] <= 1.0
        assert np.isfinite(r["loss"])


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(task=True), "needs a task with reward_components()"),
        (dict(weights=(1.0, 2.0)), "one weight per reward component"),
        (dict(lope=2), "does not combine with ['lope.num_perturbed']"),
        (dict(gprl_dimensions=2), "algorithm.num_dimensions=2 but task 'addition' has 3"),
    ],
)
def test_configs_that_cannot_work_are_refused_in_one_line(tmp_path, change, message):
    config = tiny_config(tmp_path)
    if "task" in change:  # the countdown recipe, with this algorithm
        algorithm, config = config.algorithm, countdown_config()
        config.algorithm = algorithm
    if "weights" in change:
        config.algorithm.weights = change["weights"]
    if "gprl_dimensions" in change:
        config.algorithm = gprl_config().algorithm
        config.algorithm.update(num_dimensions=change["gprl_dimensions"], weights=None)
    if "lope" in change:
        config.lope.num_perturbed = change["lope"]
    with pytest.raises(ValueError, match=re.escape(message)):
        train(config)


def test_a_pool_keeps_the_reward_and_its_components_apart():
    # The pool caches reward functions by equality: the two of one task must not be equal.
    task = AdditionTask()
    reward, components = TaskReward(task), TaskRewardComponents(task)
    assert reward != components and components != reward
    assert reward == TaskReward(task) and components == TaskRewardComponents(task)
    assert hash(components) == hash(TaskRewardComponents(task))
    assert components("", "124", "123") == task.reward_components("124", "123")
