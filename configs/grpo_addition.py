"""GRPO on multi-digit addition with a tiny byte-level transformer trained from scratch on CPU.

A short SFT warm start teaches the answer format, then GRPO raises held-out accuracy.

  python -m launchers.train --config=configs/grpo_addition.py
  python -m launchers.train --config=configs/grpo_addition.py --config.train.steps=10
"""

import math

from ml_collections import ConfigDict


def get_config() -> ConfigDict:
    config = ConfigDict()
    config.seed = 0
    config.run_dir = "runs/grpo_addition"

    # The policy: built from scratch with these sizes when `checkpoint` is ""; else a local HF
    # checkpoint directory, a .gguf file, or a model rljax can fetch ("smollm2").
    config.model = ConfigDict(
        dict(
            checkpoint="",
            d_model=128,
            n_layers=2,
            n_heads=4,
            n_kv_heads=2,
            d_ff=384,
            rope_theta=10000.0,
            dtype="float32",
            param_dtype="float32",
            # Mixture of experts (from scratch only): num_experts > 0 replaces each MLP by
            # top-experts_per_token routing over num_experts SwiGLU experts of width
            # expert_d_ff (0: d_ff). The sampler's expert choices are replayed in training.
            num_experts=0,
            experts_per_token=2,
            expert_d_ff=0,
            # "block" recomputes each decoder block in the backward pass instead of keeping
            # its activations (less memory for long completions, ~one more forward pass).
            remat="none",
            # > 0: attention scores of this many queries at a time in training (linear memory
            # in the sequence length instead of quadratic).
            attention_chunk=0,
        )
    )

    # Task settings besides name/max_prompt_len/eval_size/chat_template go to the task itself.
    config.task = ConfigDict(
        dict(
            name="addition",
            min_digits=1,
            max_digits=2,
            max_prompt_len=8,
            eval_size=512,
            chat_template=False,
        )
    )

    config.sft = ConfigDict(dict(steps=800, batch_size=64, learning_rate=1e-3))

    config.rollout = ConfigDict(
        dict(
            max_new_tokens=5,
            n_samples=8,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            # Extra prompt batches a step may draw to replace groups whose rewards are all
            # equal (DAPO's dynamic sampling); 0 keeps the first draw as it is.
            max_refill_rounds=0,
            # Sample with fake-quantized weights ("mxfp4", "mxfp8", "fp8") while training in
            # full precision; "none" samples with the trainer's weights.
            weight_format="none",
            # MX only: "macro_block" (a float32 scale per macro_block entries) or
            # "outlier_fallback" (the outlier_fraction largest entries kept exact).
            weight_correction="none",
            macro_block=128,
            outlier_fraction=0.01,
            # QeRL's adaptive quantization noise on the sampler's norm weights: sigma decays
            # from aqn_sigma_start to aqn_sigma_end over aqn_stages stages; 0 is off.
            aqn_sigma_start=0.0,
            aqn_sigma_end=1e-4,
            aqn_stages=10,
            # CUTS (constrained uniform top-k): cuts_fraction of each group's samples are drawn
            # uniformly from the top-cuts_top_k tokens with p >= p_max / cuts_ratio; 0 is off.
            cuts_top_k=0,
            cuts_ratio=math.e,
            cuts_fraction=0.5,
        )
    )

    # Correcting the gradient for the sampler/trainer gap of quantized rollouts: "tis"
    # (truncated IS; cap, level), "mis" (masked IS; low, high, level), "ais" (adaptive IS;
    # cap, d0) or "none". Keys besides name go to rljax.quant.mismatch's transform.
    config.rollout_correction = ConfigDict(dict(name="none"))

    # How rewards are computed: workers=0 in the driver's process; workers > 0 on a pool of
    # kind="thread" or "process" workers (process: calls past timeout_s are killed). A failed
    # call scores 0 and is counted; timeout_s=0 is no limit. token_level=True scores with the
    # task's token_rewards (in-process) for GAE to credit per token (algorithm.name="ppo").
    config.reward = ConfigDict(dict(workers=0, kind="thread", timeout_s=0.0, token_level=False))

    # Which prompts each step trains on: "none" walks the shuffled train split. From a pool of
    # the split's first pool_size prompts, "heapa" picks at the reward-median boundary (HeaPA,
    # low_fraction), every prompt scored once first; "dare" estimates each prompt's success
    # rate under the current policy from a replay of its last `records` rollouts (importance
    # weights clipped to +-clip; raw rate below ess_threshold) and favours rates near 0.5
    # (kappa); "curriculum" samples by the task's difficulty levels and moves to the next
    # level once the accuracy EMA (decay) of the current one reaches threshold (review: share
    # of earlier levels). Checkpointed.
    config.prompt_selection = ConfigDict(
        dict(
            name="none",
            pool_size=0,
            low_fraction=0.5,
            records=2048,
            kappa=20.0,
            clip=5.0,
            ess_threshold=2.0,
            threshold=0.7,
            decay=0.9,
            review=0.2,
            min_updates=5,
        )
    )

    # FreshPER replay ("fresh_per"): informative prompt groups are kept (up to capacity) and
    # every `every` steps `groups` of them (0: prompts_per_step) are drawn with priority
    # mean|reward| * exp(-age / tau) and trained on after the fresh batch, with PER importance
    # weights (alpha; beta from beta_start to beta_end over beta_steps). Checkpointed.
    config.replay = ConfigDict(
        dict(
            name="none",
            capacity=1024,
            groups=0,
            every=1,
            tau=500.0,
            alpha=0.6,
            beta_start=0.4,
            beta_end=1.0,
            beta_steps=1000,
        )
    )

    # LoPE: a prompt whose samples all fail is rolled out again num_perturbed times behind
    # Lorem-Ipsum prefixes of min_words..max_words words (rollouts_per_perturbed samples each,
    # prompts padded to max_prompt_len tokens); correct completions replace up to G - 1 of the
    # failures, trained under the original prompt. 0 is off.
    config.lope = ConfigDict(
        dict(
            num_perturbed=0,
            rollouts_per_perturbed=4,
            min_words=4,
            max_words=12,
            max_prompt_len=96,
        )
    )

    config.algorithm = ConfigDict(
        dict(
            name="grpo",
            clip_eps=0.2,
            clip_eps_high=0.2,
            kl_coef=0.0,
            kl_estimator="k3",
            entropy_coef=0.0,
            normalize_std=True,
            aggregation="token-mean",
        )
    )

    config.train = ConfigDict(
        dict(
            steps=300,
            prompts_per_step=64,
            learning_rate=1e-4,
            warmup_steps=5,
            max_grad_norm=1.0,
            weight_decay=0.0,
            epochs=1,
            minibatches=2,
            microbatches=1,
            vocab_chunk=8192,
            # > 0: the trainer's forward passes pack the sequences into this share of the
            # rows when they fit (same results, less padding); 0 is off.
            pack_ratio=0.0,
            eval_every=50,
            checkpoint_every=50,
            max_checkpoints=2,
            # Bounded staleness: sample with the policy of up to this many updates ago (the
            # schedule of asynchronous RL, run in order); 0 is synchronous.
            max_staleness=0,
            # An update whose loss or gradients are non-finite is skipped (guard/skipped, with
            # the first non-finite tensor named in the log); this many in a row stop the run.
            max_consecutive_skips=5,
            # Prompt groups per step written to run_dir/samples.jsonl (prompt, completions,
            # rewards); -1 writes every group, 0 none.
            log_samples=0,
        )
    )

    # Device mesh; -1 takes all remaining devices. expert splits MoE experts over devices.
    # sampler_devices > 0 gives the sampler the first that many devices (its own mesh, the
    # weights resharded onto it every step, time/reshard_s) and the trainer the rest.
    config.mesh = ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1, sampler_devices=0))
    return config
