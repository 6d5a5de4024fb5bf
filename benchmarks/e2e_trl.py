"""The TRL side of `benchmarks/e2e.py`: TRL's `GRPOTrainer` on the SmolLM2 recipe's step, timed.

Runs in its own virtual environment (torch 2.13 CPU, trl 1.16, transformers 5.25) and never
imports jax or rljax: the reward is rljax's `numeric_match_reward`, loaded from the file
`rljax/rewards/math.py` alone (it needs only the standard library).

  VENV/bin/python -m benchmarks.e2e_trl --export DIR      # GGUF -> float32 safetensors in DIR
  VENV/bin/python -m benchmarks.e2e_trl --work WORK --model_dir DIR --steps N

`--work` is the folder the parent (`benchmarks.e2e`) wrote: prompts.json (texts, answers and
rljax's token ids, in the order the rljax run draws them) and ref_logits.npy (rljax's float32
logits at the last position of a few prompts). The worker checks the tokenization and the
logits first, then trains N steps and prints one line per record, `E2E {json}`:
kind "check" (logits_rel_err, tokens_match), kind "step" (step, step_s, generation_s,
reward_s, old_logprobs_s, update_s, other_s, reward_mean), kind "versions".

Phases (wrappers with time.perf_counter around TRL 1.16's own methods):
  generation    `_generate_single_turn` (HF `generate` on the 32 left-padded prompts)
  reward        `_calculate_rewards`
  old-log-probs `_get_per_token_logps_and_entropies` when called from
                `_generate_and_score_completions` (TRL skips it on-policy: measured 0)
  update        `training_step` minus its `_prepare_inputs`, plus `_clip_grad_norm` and
                `optimizer.step()` (between the on_pre_optimizer_step/on_optimizer_step
                callbacks)
  step          between consecutive `on_step_end` callbacks (the first from on_train_begin)
  other         step minus the phases above (tokenizing, padding, advantages, logging, ...)

The export: transformers dequantizes the Q4_1 tensors to float32 when it loads the GGUF but
keeps the model marked as GGUF-quantized, which `save_pretrained` refuses; the marker is
dropped before saving (the tensors are plain float32). Its logits match rljax's `load_gguf`
forward to 1.6e-6 relative. TRL pads prompts to the longest of the 32 and completions to the
longest completion (EOS included in the loss, as in rljax).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
import time

import numpy as np

from benchmarks.e2e_worker import emit, reward_function


def export(gguf: str, out: str) -> None:
    """The registry GGUF as a float32 safetensors HF directory (config, weights, tokenizer)."""
    import torch
    import transformers

    folder, name = os.path.split(gguf)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32
    )
    # transformers dequantizes GGUF tensors to float32 on load but still marks the model as
    # GGUF-quantized, which save_pretrained refuses: the weights are plain float32, so drop it.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".", dir=os.path.dirname(out))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)  # whole or absent: a half-written export is never used


class PhaseClock:
    """Seconds per phase of the current optimizer step, and the step boundaries."""

    def __init__(self):
        self.phases: dict[str, float] = {}
        self.in_scoring = False
        self.mark = None
        self.steps: list[dict[str, float]] = []

    def add(self, phase: str, seconds: float) -> None:
        self.phases[phase] = self.phases.get(phase, 0.0) + seconds

    def wrap(self, fn, phase, when=lambda: True, subtract=None):
        """`fn` timed into `phase` (if `when()`); `subtract` names a nested phase timed apart."""

        def timed(*args, **kwargs):
            start = time.perf_counter()
            before = self.phases.get(subtract, 0.0) if subtract else 0.0
            try:
                return fn(*args, **kwargs)
            finally:
                if when():
                    nested = self.phases.get(subtract, 0.0) - before if subtract else 0.0
                    self.add(phase, time.perf_counter() - start - nested)

        return timed

    @contextlib.contextmanager
    def scoring(self):
        self.in_scoring = True
        try:
            yield
        finally:
            self.in_scoring = False


def instrument(trainer, clock: PhaseClock, rewards: list[float]):
    """Wraps the trainer's methods (instance attributes shadow the class's) with the clock."""
    import transformers

    t = trainer
    t._generate_single_turn = clock.wrap(t._generate_single_turn, "generation_s")
    t._calculate_rewards = clock.wrap(t._calculate_rewards, "reward_s")
    t._get_per_token_logps_and_entropies = clock.wrap(
        t._get_per_token_logps_and_entropies, "old_logprobs_s", when=lambda: clock.in_scoring
    )
    score = t._generate_and_score_completions

    def scored(*args, **kwargs):
        with clock.scoring():
            return score(*args, **kwargs)

    t._generate_and_score_completions = scored
    # _prepare_inputs (generation, reward, advantages) runs inside the first training_step of
    # each step: it is timed as "prepare" and left out of the update.
    t._prepare_inputs = clock.wrap(t._prepare_inputs, "prepare_s")
    t.training_step = clock.wrap(t.training_step, "update_s", subtract="prepare_s")
    t._clip_grad_norm = clock.wrap(t._clip_grad_norm, "update_s")

    class Boundaries(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            clock.mark = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kwargs):
            clock.optimizer_start = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kwargs):
            clock.add("update_s", time.perf_counter() - clock.optimizer_start)

        def on_step_end(self, args, state, control, **kwargs):
            now = time.perf_counter()
            p = clock.phases
            record = dict(
                step=state.global_step,
                step_s=now - clock.mark,
                generation_s=p.get("generation_s", 0.0),
                reward_s=p.get("reward_s", 0.0),
                old_logprobs_s=p.get("old_logprobs_s", 0.0),
                update_s=p.get("update_s", 0.0),
                reward_mean=float(np.mean(rewards[-32:])) if rewards else float("nan"),
            )
            phases = ("generation_s", "reward_s", "old_logprobs_s", "update_s")
            record["other_s"] = record["step_s"] - sum(record[k] for k in phases)
            emit("step", **record)
            clock.phases, clock.mark = {}, now

    trainer.add_callback(Boundaries())


def check(model, tokenizer, work: dict, ref: np.ndarray) -> dict:
    """Tokenization of every prompt against rljax's ids; last-position logits against rljax's."""
    import torch

    texts = [p["text"] for p in work["prompts"]]
    ids = tokenizer(text=texts)["input_ids"]  # what GRPOTrainer._tokenize_prompts does
    tokens_match = all(list(a) == p["ids"] for a, p in zip(ids, work["prompts"]))
    ours = []
    with torch.no_grad():
        for row in work["check_ids"]:
            logits = model(input_ids=torch.tensor([row])).logits
            ours.append(logits[0, -1].double().numpy())
    ours = np.stack(ours)
    err = float(np.max(np.abs(ours - ref)) / np.max(np.abs(ref)))
    return dict(logits_rel_err=err, tokens_match=tokens_match)


def train(args: argparse.Namespace) -> None:
    import datasets
    import torch
    import transformers
    import trl

    torch.set_num_threads(args.threads)
    with open(os.path.join(args.work, "prompts.json")) as f:
        work = json.load(f)
    s = work["settings"]
    ref = np.load(os.path.join(args.work, "ref_logits.npy")).astype(np.float64)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model_dir)
    result = check(model.eval(), tokenizer, work, ref)
    emit(
        "check", **result, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    if not result["tokens_match"] or result["logits_rel_err"] > s["logit_tol"]:
        raise SystemExit(f"TRL side does not run rljax's model/prompts: {result}")

    rewards: list[float] = []
    reward = reward_function(rewards)

    n = args.steps * s["prompts_per_step"]
    rows = [{"prompt": p["text"], "answer": p["answer"]} for p in work["prompts"][:n]]
    out_dir = tempfile.mkdtemp(prefix="e2e_trl_")
    config = trl.GRPOConfig(
        output_dir=out_dir,
        max_steps=args.steps,
        per_device_train_batch_size=s["prompts_per_step"],  # completions per micro-batch
        gradient_accumulation_steps=s["microbatches"],
        num_generations=s["group_size"],
        max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"],
        top_k=0,
        top_p=1.0,
        learning_rate=s["learning_rate"],
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=s["warmup_steps"],
        max_grad_norm=s["max_grad_norm"],
        weight_decay=0.0,
        beta=0.0,
        epsilon=s["clip_eps"],
        loss_type="dapo",
        scale_rewards="group",
        shuffle_dataset=False,
        bf16=False,
        seed=0,
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
    )
    # One step = one generation of prompts_per_step * group_size completions + one optimizer
    # step over `microbatches` micro-batches of prompts_per_step completions each.
    assert config.generation_batch_size == s["prompts_per_step"] * s["group_size"], config
    assert config.steps_per_generation == s["microbatches"], config
    trainer = trl.GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=datasets.Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    instrument(trainer, PhaseClock(), rewards)
    try:
        trainer.train()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    emit(
        "versions",
        trl=trl.__version__,
        transformers=transformers.__version__,
        torch=torch.__version__,
        torch_threads=torch.get_num_threads(),
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--export", default="", help="write the HF export of --gguf to this dir")
    p.add_argument("--gguf", default="", help="the SmolLM2 GGUF file (for --export)")
    p.add_argument("--work", default="", help="the parent's work dir (prompts, ref logits)")
    p.add_argument("--model_dir", default="", help="the float32 safetensors export")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = p.parse_args(argv)
    if args.export:
        export(args.gguf, args.export)
    else:
        train(args)


if __name__ == "__main__":
    main()
