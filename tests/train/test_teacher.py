"""On-policy distillation's teacher (rljax.train.teacher): its scores against a plain forward
pass, loading from a run directory, the errors a config gets, and the driver scoring every
batch with it (a teacher identical to the student gives a reverse KL of exactly 0)."""

import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from configs.grpo_addition import get_config
from rljax.models.config import TransformerConfig
from rljax.models.transformer import create_model, forward, positions_from_mask
from rljax.train.builders import (
    build_algorithm,
    build_optimizer,
    build_policy,
    build_train_state,
)
from rljax.train.checkpoint import Checkpointer
from rljax.train.collection import with_teacher
from rljax.train.loop import train
from rljax.train.teacher import Teacher, load_teacher, teacher_scorer

TINY = dict(d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)


def tiny_config(run_dir, **overrides):
    config = get_config()
    config.run_dir = str(run_dir)
    config.model.update(**TINY)
    config.sft.steps = 0
    config.train.update(steps=2, prompts_per_step=8, eval_every=1000, warmup_steps=1)
    config.rollout.update(n_samples=4, max_new_tokens=4)
    config.task.eval_size = 8
    if "algorithm.name" in overrides:  # another preset: none of GRPO's settings
        config.algorithm = ConfigDict({"name": overrides.pop("algorithm.name")})
    for key, value in overrides.items():
        section, name = key.split(".")
        config[section][name] = value
    return config


def save_teacher(run_dir, sharpen=1.0, seed=0):
    """A teacher run directory: config.json and a checkpoint of a freshly initialised policy
    whose output matrix is scaled by `sharpen` (a sharper, different distribution)."""
    config = tiny_config(run_dir)
    config.seed = seed
    _, model_config, _, params = build_policy(config)
    params["embed"][...] = params["embed"][...] * sharpen
    algorithm = build_algorithm(config, model_config.vocab_size)
    state, _ = build_train_state(
        config, model_config, params, algorithm, build_optimizer(config.train)
    )
    checkpointer = Checkpointer(str(run_dir / "checkpoints"), async_save=False)
    checkpointer.save(5, state, {"position": 0})
    checkpointer.close()
    (run_dir / "config.json").write_text(config.to_json_best_effort())
    return params


def test_scores_are_the_teachers_log_softmax_of_the_sampled_tokens():
    config = TransformerConfig(
        vocab_size=37, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32
    )
    graphdef, params = create_model(config, seed=3)
    rows = {
        "prompt_tokens": np.array([[0, 0, 5, 6], [7, 8, 9, 10]], np.int32),
        "prompt_mask": np.array([[0, 0, 1, 1], [1, 1, 1, 1]], bool),
        "completion_tokens": np.array([[11, 12, 13], [14, 15, 0]], np.int32),
        "completion_mask": np.array([[1, 1, 1], [1, 1, 0]], bool),
    }
    scores = teacher_scorer(Teacher(graphdef, params, 0), vocab_chunk=10, top_k=5)(rows)
    got = scores["teacher_logprobs"]
    tokens = jnp.concatenate([rows["prompt_tokens"], rows["completion_tokens"]], 1)
    mask = jnp.concatenate([rows["prompt_mask"], rows["completion_mask"]], 1)
    logits = np.asarray(forward(graphdef, params, tokens, positions_from_mask(mask), mask)[0])
    for b in range(2):
        for t in range(3):
            if not rows["completion_mask"][b, t]:
                assert got[b, t] == 0
                continue
            z = logits[b, 3 + t].astype(np.float64)  # the state before completion token t
            logp = z - z.max() - np.log(np.exp(z - z.max()).sum())
            np.testing.assert_allclose(got[b, t], logp[rows["completion_tokens"][b, t]], atol=1e-5)
            # GKD's top 5: the 5 likeliest tokens, likeliest first, and their log-probs.
            top = np.argsort(-logp)[:5]
            np.testing.assert_array_equal(scores["teacher_topk_ids"][b, t], top)
            np.testing.assert_allclose(scores["teacher_topk_logprobs"][b, t], logp[top], atol=1e-5)
    off = ~rows["completion_mask"]
    assert not scores["teacher_topk_ids"][off].any()
    assert not scores["teacher_topk_logprobs"][off].any()


def test_load_teacher_restores_the_runs_checkpoint(tmp_path):
    teacher_dir = tmp_path / "teacher"
    teacher_dir.mkdir()
    params = save_teacher(teacher_dir, sharpen=3.0)
    student = tiny_config(tmp_path / "student", **{"teacher.run_dir": str(teacher_dir)})
    tokenizer = build_policy(student)[0]
    teacher = load_teacher(student, tokenizer)
    assert teacher.step == 5
    np.testing.assert_allclose(teacher.params["embed"][...], params["embed"][...])


def test_config_errors_name_the_key(tmp_path):
    config = tiny_config(tmp_path / "student")
    tokenizer = build_policy(config)[0]
    opd = build_algorithm(
        tiny_config(tmp_path, **{"algorithm.name": "on_policy_distillation"}), 259
    )
    with pytest.raises(ValueError, match="set teacher.run_dir"):
        with_teacher(
            None,
            tiny_config(tmp_path, **{"algorithm.name": "on_policy_distillation"}),
            tokenizer,
            opd,
        )
    grpo = build_algorithm(config, 259)
    config.teacher.run_dir = str(tmp_path)
    with pytest.raises(ValueError, match="reads no teacher scores"):
        with_teacher(None, config, tokenizer, grpo)
    config.teacher.update(run_dir="", top_k=8)
    with pytest.raises(ValueError, match="reads no teacher scores"):
        with_teacher(None, config, tokenizer, grpo)
    gkd_config = tiny_config(tmp_path, **{"algorithm.name": "gkd", "teacher.run_dir": "x"})
    with pytest.raises(ValueError, match="set teacher.top_k > 0"):
        with_teacher(None, gkd_config, tokenizer, build_algorithm(gkd_config, 259))
    opd_config = tiny_config(
        tmp_path, **{"algorithm.name": "on_policy_distillation", "teacher.run_dir": "x"}
    )
    opd_config.teacher.top_k = 4
    with pytest.raises(ValueError, match="does not read the teacher's top-k"):
        with_teacher(None, opd_config, tokenizer, opd)
    opd_config = tiny_config(tmp_path, **{"algorithm.name": "on_policy_distillation"})
    opd_config.teacher.run_dir = str(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        with_teacher(None, opd_config, tokenizer, opd)


@pytest.mark.parametrize("sharpen", [1.0, 10.0])
def test_the_driver_scores_every_batch_with_the_teacher(tmp_path, sharpen):
    # The teacher is the student's own initialisation (seed 0), its output matrix scaled by
    # `sharpen`. At 1 it IS the student: the reverse-KL estimate must be 0 at every step (a
    # teacher score off by one position, or of another row, would not be), and the advantages
    # are 0, so the student does not move. At 10 it is a sharper teacher: the estimate is
    # positive from the first step.
    teacher_dir = tmp_path / "teacher"
    teacher_dir.mkdir()
    save_teacher(teacher_dir, sharpen=sharpen, seed=0)
    config = tiny_config(
        tmp_path / "student",
        **{"algorithm.name": "on_policy_distillation", "teacher.run_dir": str(teacher_dir)},
    )
    config.train.update(steps=3, minibatches=1)
    records = train(config)
    kl = [r["distill/reverse_kl"] for r in records if "distill/reverse_kl" in r]
    assert len(kl) == 3 and any("time/teacher_s" in r for r in records)
    if sharpen == 1.0:
        np.testing.assert_allclose(kl, 0.0, atol=1e-5)
    else:
        assert min(kl) > 0.1, kl


def test_gkd_through_the_driver_is_zero_against_itself_and_pulls_toward_a_sharper_teacher(
    tmp_path,
):
    # GKD reads the teacher's top-k tokens, scored by the driver, and the student's log-probs
    # of them from the update's own pass. A teacher equal to the student: the divergence is 0
    # (one step: the gradient is 0 up to rounding, which Adam would scale up to a step). Then
    # a sharper teacher: it is positive and falls as the student learns.
    runs = {}
    for sharpen in (1.0, 10.0):
        teacher_dir = tmp_path / f"teacher{sharpen}"
        teacher_dir.mkdir()
        save_teacher(teacher_dir, sharpen=sharpen, seed=0)
        config = tiny_config(
            tmp_path / f"student{sharpen}",
            **{"algorithm.name": "gkd", "teacher.run_dir": str(teacher_dir), "teacher.top_k": 8},
        )
        config.train.update(steps=4 if sharpen > 1 else 1, learning_rate=1e-2)
        runs[sharpen] = [r["gkd/jsd"] for r in train(config) if "gkd/jsd" in r]
    np.testing.assert_allclose(runs[1.0], 0.0, atol=1e-6)
    assert runs[10.0][0] > 0.01 and runs[10.0][-1] < 0.8 * runs[10.0][0], runs[10.0]
