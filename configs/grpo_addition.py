"""GRPO on multi-digit addition with a tiny byte-level transformer trained from scratch on CPU.

A short SFT warm start teaches the answer format, then GRPO raises held-out accuracy.

  python -m launchers.train --config=configs/grpo_addition.py
  python -m launchers.train --config=configs/grpo_addition.py --config.train.steps=10
"""

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
            eval_every=50,
            checkpoint_every=50,
            max_checkpoints=2,
            # Testing only: SIGKILL the process right after the checkpoint of this step is written.
            kill_at_step=-1,
        )
    )

    # Device mesh; -1 takes all remaining devices.
    config.mesh = ConfigDict(dict(data=-1, fsdp=1, tensor=1))
    return config
