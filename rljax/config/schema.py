"""The run config's schema: every section's keys with their default, type, range and doc.

One declarative table (`SCHEMA`) is the home of every default the driver uses: a recipe
(`configs/*.py`) starts from `default_config()` and sets what it chooses, and
`rljax.config.validate_config` fills whatever a config leaves out from here, so code reads a
complete config and never supplies a default. A key's type is its default's (an int count is
never a float; an int is a fine float). Three sections are open (`OPEN_SECTIONS`): besides the
keys listed here, they take the keyword arguments of what they name (the algorithm preset,
the task, the rollout correction), whose defaults live in those callables' signatures.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ml_collections import ConfigDict


@dataclasses.dataclass(frozen=True)
class Key:
    """One config key.

    Attributes:
      default: the value a config that leaves the key out gets; its type is the key's type.
      doc: one line saying what the key does.
      choices: the values it may take (None: any of its type).
      min: inclusive lower bound (None: none).
      gt: exclusive lower bound (None: none).
      max: inclusive upper bound (None: none).
      hint: what the range's edge means, appended to a range error, e.g. "0: off".
    """

    default: Any
    doc: str
    choices: tuple[Any, ...] | None = None
    min: float | None = None
    gt: float | None = None
    max: float | None = None
    hint: str = ""


# Sections whose other keys are the keyword arguments of what `name` names (validate.py checks
# them against its signature); only the keys listed here are the driver's own.
OPEN_SECTIONS = ("algorithm", "task", "rollout_correction")

SCHEMA: dict[str, Key | dict[str, Key]] = {
    "seed": Key(0, "seed of the model init, the task's data, sampling and every random draw"),
    "run_dir": Key("runs/default", "where checkpoints, metrics.jsonl and config.json go"),
    # The policy: from scratch with these sizes when `checkpoint` is "".
    "model": {
        "kind": Key(
            "causal",
            '"causal": a decoder LM sampled token by token; "diffusion": a masked-diffusion LM '
            "(LLaDA-style, from scratch; rljax.diffusion) with its block-wise sampler, masked "
            "SFT and the diffusion algorithms",
            choices=("causal", "diffusion"),
        ),
        "checkpoint": Key(
            "",
            '"": a byte-level model from scratch (sizes below); else a local HF checkpoint '
            'directory, a .gguf file or a model rljax can fetch ("smollm2", "gemma3")',
        ),
        "d_model": Key(128, "scratch model: hidden size"),
        "n_layers": Key(2, "scratch model: decoder blocks"),
        "n_heads": Key(4, "scratch model: attention heads"),
        "n_kv_heads": Key(2, "scratch model: key/value heads (grouped-query attention)"),
        "d_ff": Key(384, "scratch model: MLP width"),
        "rope_theta": Key(10000.0, "scratch model: RoPE base"),
        "dtype": Key("float32", "compute dtype of the policy"),
        "param_dtype": Key("float32", "storage dtype of the policy's parameters"),
        "num_experts": Key(
            0,
            "scratch model: > 0 replaces each MLP by top-experts_per_token routing over this "
            "many SwiGLU experts (the sampler's routes are replayed in training)",
        ),
        "experts_per_token": Key(2, "MoE: experts each token is routed to"),
        "expert_d_ff": Key(0, "MoE: width of each expert (0: d_ff)"),
        "remat": Key(
            "none",
            '"block" recomputes each decoder block in the backward pass (less memory for long '
            "completions, ~one more forward pass)",
            choices=("none", "block"),
        ),
        "attention_chunk": Key(
            0,
            "> 0: attention scores of this many queries at a time in training (linear memory "
            "in the sequence length)",
            min=0,
        ),
        "scan_layers": Key(
            True,
            "run the decoder blocks with a scan (compile time flat in depth); False unrolls "
            "them (slower to compile)",
        ),
        "attention_impl": Key(
            "einsum",
            'attention kernel, the same maths up to rounding: "einsum" (reference), "xla" or '
            '"cudnn" (jax.nn.dot_product_attention), "auto" (cudnn/xla on GPU, einsum on CPU)',
            choices=("einsum", "xla", "cudnn", "auto"),
        ),
    },
    # Open: the task's own settings (e.g. addition's min_digits) go to its constructor.
    "task": {
        "name": Key("addition", "the task (rljax.data.tasks.TASKS)"),
        "max_prompt_len": Key(8, "prompt tokens (prompts are left-padded to this)", min=1),
        "max_answer_len": Key(32, "answer tokens kept for SFT targets and scoring", min=1),
        "eval_size": Key(512, "held-out problems scored at every eval", min=1),
        "chat_template": Key(False, "format prompts with the tokenizer's chat template"),
    },
    "sft": {
        "steps": Key(800, "SFT warm-start steps before RL (0: none)", min=0),
        "batch_size": Key(64, "SFT examples per step (checked when steps > 0)"),
        "learning_rate": Key(1e-3, "SFT learning rate (checked when steps > 0)"),
        "scripted_episodes": Key(
            4096, "episodic tasks: scripted episodes the warm start plays and cycles through", min=1
        ),
        # model.kind="diffusion" only: LLaDA's masked SFT with AdamW, warm-up then cosine.
        "warmup_steps": Key(0, "diffusion: linear warm-up steps of the SFT learning rate", min=0),
        "weight_decay": Key(0.0, "diffusion: AdamW weight decay of the SFT", min=0),
        "mask_eps": Key(
            1e-3,
            "diffusion: lower bound of the SFT masking ratio t ~ U(mask_eps, 1) (LLaDA: 1e-3)",
            min=0,
            max=0.999,
        ),
    },
    "rollout": {
        "max_new_tokens": Key(5, "completion tokens sampled per prompt", min=1),
        "n_samples": Key(8, "samples per prompt: the group size (>= 2)"),
        "temperature": Key(1.0, "sampling temperature", gt=0),
        "top_k": Key(0, "top-k sampling (0: off)", min=0),
        "top_p": Key(1.0, "nucleus sampling", gt=0, max=1, hint="1 disables it"),
        "max_refill_rounds": Key(
            0,
            "extra prompt batches a step may draw to replace groups whose rewards are all "
            "equal (DAPO's dynamic sampling); 0 keeps the first draw",
            min=0,
        ),
        "weight_format": Key(
            "none",
            'sample with fake-quantized weights ("mxfp4", "mxfp8", "fp8") while training in '
            'full precision; "none": the trainer\'s weights',
        ),
        "weight_correction": Key(
            "none",
            'MX only: "macro_block" (a float32 scale per macro_block entries) or '
            '"outlier_fallback" (the outlier_fraction largest entries kept exact)',
        ),
        "macro_block": Key(128, "entries per float32 scale of the macro_block correction"),
        "outlier_fraction": Key(0.01, "share of entries the outlier_fallback keeps exact"),
        "aqn_sigma_start": Key(
            0.0, "QeRL's adaptive quantization noise on the sampler's norm weights (0: off)"
        ),
        "aqn_sigma_end": Key(1e-4, "AQN sigma at the last stage"),
        "aqn_stages": Key(10, "AQN stages (they divide train.steps)"),
        "cuts_top_k": Key(
            0,
            "CUTS: cuts_fraction of each group's samples drawn uniformly from the top-cuts_top_k "
            "tokens with p >= p_max / cuts_ratio (0: off)",
            min=0,
        ),
        "cuts_ratio": Key(math.e, "CUTS: probability ratio to the top token", min=1),
        "cuts_fraction": Key(0.5, "CUTS: share of each group sampled that way", min=0, max=1),
        # The rollout engine (rljax.rollout.engine); its schedule keys are execution-only.
        "engine": Key(
            "continuous",
            '"continuous": the rollout engine (decode slots refilled as sequences stop, one '
            'prefill per prompt shared by its samples); "static": one fixed batch decoded '
            "until its longest row ends (the samples differ: keys are drawn another way)",
            choices=("continuous", "static"),
        ),
        "slots": Key(64, "engine: sequences decoded at once (at most the step's samples)", min=1),
        "decode_steps": Key(16, "engine: tokens decoded per device call between admissions", min=1),
        "admit_after": Key(
            0,
            "engine: a decode call returns once this many slots are free while requests wait",
            min=0,
            hint="0: slots // 8",
        ),
        "span_bucket": Key(
            128,
            "engine: decode attention reads the cache up to the next multiple of this past the "
            "longest live row",
            min=0,
            hint="0: the whole cache, one compilation",
        ),
        "prefill_rows": Key(8, "engine: prompts prefilled per device call", min=1),
        "stop_strings": Key(
            (), "engine: a completion ends with the token completing any of these strings"
        ),
        "extra_eos_ids": Key(
            (), "engine: token ids that end a completion besides the tokenizer's EOS"
        ),
        # model.kind="diffusion" only: the block-wise sampler (max_new_tokens is its length).
        "block_size": Key(
            0,
            "diffusion: tokens per block, a divisor of max_new_tokens",
            min=0,
            hint="0: one block",
        ),
        "steps_per_block": Key(
            0,
            "diffusion: denoising steps (forward passes) per block",
            min=0,
            hint="0: one token per step",
        ),
        "remasking": Key(
            "low_confidence",
            "diffusion: which masked positions each step unmasks first",
            choices=("low_confidence", "random"),
        ),
        "block_sizes": Key(
            (),
            "diffusion: Block-R1's candidate block sizes; each prompt's group is sampled at the "
            "candidate with the highest measured mean reward (): off",
        ),
    },
    # Open: the correction's keyword arguments (rljax.quant.mismatch).
    "rollout_correction": {
        "name": Key(
            "none",
            'sampler/trainer gap correction of quantized rollouts: "tis" (truncated IS), "mis" '
            '(masked IS), "ais" (adaptive IS), "icepop" (IS weight zeroed outside a ratio band), '
            '"rejection" (tokens or rows past a k2/k3 divergence threshold) or "none"',
        ),
    },
    "reward": {
        "workers": Key(
            2,
            "workers of reward.kind's pool (persistent, reused every step)",
            min=0,
            hint="0 only with reward.kind='inline'",
        ),
        "kind": Key(
            "process",
            'where the reward runs: "process" (a pool of worker processes: a call past '
            'timeout_s is killed, an exit or crash is contained), "thread" (a pool of threads: '
            'a late call is abandoned, not stopped) or "inline" (in the trainer: fastest; '
            "exceptions and sys.exit are caught, timeouts are soft and os._exit ends the run)",
            choices=("process", "thread", "inline"),
        ),
        "timeout_s": Key(
            60.0,
            "seconds a reward call may take; a failed call scores 0",
            min=0,
            hint="0: no limit",
        ),
        "max_abs": Key(
            1e6,
            "a reward beyond +-max_abs scores 0 and counts as reward/failures_out_of_range",
            gt=0,
        ),
        "token_level": Key(
            False,
            "score with the task's token_rewards for GAE to credit per token "
            '(algorithm.name="ppo")',
        ),
    },
    "prompt_selection": {
        "name": Key(
            "none",
            'which prompts each step trains on: "none" walks the shuffled train split; '
            '"heapa", "dare" or "curriculum" (checkpointed)',
        ),
        "pool_size": Key(0, "prompts in the pool: the split's first this many (0: all)"),
        "low_fraction": Key(0.5, "heapa: share of the batch below the reward median"),
        "records": Key(2048, "dare: rollouts kept per prompt's success-rate replay"),
        "kappa": Key(20.0, "dare: how sharply rates near 0.5 are favoured"),
        "clip": Key(5.0, "dare: importance weights clipped to +-clip"),
        "ess_threshold": Key(2.0, "dare: below this effective sample size the raw rate is used"),
        "threshold": Key(0.7, "curriculum: accuracy EMA that moves to the next level"),
        "decay": Key(0.9, "curriculum: decay of the accuracy EMA"),
        "review": Key(0.2, "curriculum: share of earlier levels in a batch"),
        "min_updates": Key(5, "curriculum: updates at a level before it may move on"),
    },
    "replay": {
        "name": Key(
            "none",
            '"fresh_per": keep informative prompt groups and replay them by freshness-decayed '
            "priority after the fresh batch (checkpointed)",
            choices=("none", "fresh_per"),
        ),
        "capacity": Key(1024, "groups kept"),
        "groups": Key(0, "groups replayed per replay step (0: train.prompts_per_step)"),
        "every": Key(1, "replay every this many steps"),
        "tau": Key(500.0, "priority mean|reward| * exp(-age / tau)"),
        "alpha": Key(0.6, "PER priority exponent"),
        "beta_start": Key(0.4, "PER importance-weight exponent at the start"),
        "beta_end": Key(1.0, "PER importance-weight exponent after beta_steps"),
        "beta_steps": Key(1000, "steps from beta_start to beta_end"),
    },
    "lope": {
        "num_perturbed": Key(
            0,
            "LoPE: an all-failed prompt is rolled out again this many times behind "
            "Lorem-Ipsum prefixes; correct completions replace failures (0: off)",
        ),
        "rollouts_per_perturbed": Key(4, "samples per perturbed prompt"),
        "min_words": Key(4, "shortest Lorem-Ipsum prefix, in words"),
        "max_words": Key(12, "longest Lorem-Ipsum prefix, in words"),
        "max_prompt_len": Key(96, "perturbed prompts' padded length (> task.max_prompt_len)"),
    },
    # Open: the preset's settings (rljax.algorithms): its named parameters, a dataclass
    # parameter's fields as flat keys (rljax.train.builders.preset_settings).
    "algorithm": {
        "name": Key("grpo", "the algorithm preset (rljax.algorithms, or register_algorithm)"),
    },
    "train": {
        "steps": Key(300, "RL steps", min=1),
        "prompts_per_step": Key(64, "prompts per RL step", min=1),
        "learning_rate": Key(1e-4, "peak learning rate (AdamW)", gt=0),
        "warmup_steps": Key(5, "linear warm-up steps", min=0),
        "max_grad_norm": Key(1.0, "global gradient-norm clip", gt=0),
        "weight_decay": Key(0.0, "AdamW weight decay", min=0),
        "epochs": Key(1, "passes over each step's batch", min=1),
        "minibatches": Key(2, "optimizer updates per epoch", min=1),
        "microbatches": Key(1, "gradient-accumulation splits of a minibatch", min=1),
        "vocab_chunk": Key(8192, "vocabulary entries per log-softmax chunk", min=1),
        "pack_ratio": Key(
            0.0,
            "> 0: the trainer's forward passes pack the sequences into this share of the rows "
            "when they fit (same results, less padding)",
            min=0,
            max=1,
            hint="0: off",
        ),
        "pad_multiple": Key(
            16,
            "before learning, prompts and completions are cut to the batch's longest, rounded "
            "up to a multiple of this (a few compiled shapes; same results, less padding)",
            min=0,
            hint="0: off (every batch at task.max_prompt_len + rollout.max_new_tokens)",
        ),
        "old_logprobs": Key(
            "auto",
            'the old policy\'s log-probs: "recompute" (a forward pass before the update), '
            '"sampler" (the sampler\'s log-probs, any epochs/minibatches) or "auto" (on-policy, '
            "1 epoch x 1 minibatch: the update's detached log-probs, no extra pass, unless a "
            "transform or statistic reads the old policy; else recompute)",
            choices=("auto", "recompute", "sampler"),
        ),
        "top_entropy_fraction": Key(
            1.0,
            "train the policy-gradient term on this share of tokens, the highest-entropy ones "
            "(the 80/20 rule, arXiv 2506.01939: 0.2; 1.0: all)",
            gt=0,
            max=1,
        ),
        "eval_every": Key(50, "steps between held-out evals", min=1),
        "checkpoint_every": Key(50, "steps between checkpoints", min=1),
        "max_checkpoints": Key(2, "checkpoints kept", min=1),
        "max_staleness": Key(
            0,
            "bounded staleness: sample with the policy of up to this many updates ago "
            "(0: synchronous)",
            min=0,
        ),
        "overlap": Key(
            "off",
            "asynchronous RL: a sampler thread runs up to max_staleness batches ahead of the "
            'trainer ("free": newest weights, swapped in mid-rollout on the engine; '
            '"deterministic": the ordered max_staleness schedule, equal to it bit for bit)',
            choices=("off", "free", "deterministic"),
        ),
        "max_consecutive_skips": Key(
            5,
            "non-finite updates are skipped (guard/skipped); this many in a row stop the run",
            min=1,
        ),
        "log_samples": Key(
            0,
            "prompt groups per step written to run_dir/samples.jsonl (-1: every group, 0: none)",
            min=-1,
        ),
        "compilation_cache": Key(
            "~/.cache/rljax/jax",
            "JAX's persistent compilation cache directory, so a restart compiles nothing twice "
            '(JAX_COMPILATION_CACHE_DIR wins when set; "": off)',
        ),
        "allow_config_change": Key(
            False,
            "resume a run_dir whose config.json differs in keys that change the train state or "
            "the meaning of its steps (rljax.train.run_dir.FREE_KEYS may always change)",
        ),
        "allow_unverified_checkpoint": Key(
            False,
            "restore a checkpoint without its manifest (files not verified; restored tensors "
            "are still checked finite)",
        ),
    },
    # Where metrics go besides metrics.jsonl (rljax.metrics.backends).
    "log": {
        "backends": Key(
            "jsonl,tensorboard",
            'comma-separated: "jsonl" (required), "tensorboard", "wandb", "mlflow" (extras)',
        ),
        "project": Key("rljax", "the W&B project / MLflow experiment"),
        "name": Key("", "the W&B / MLflow run name (empty: the run directory's name)"),
    },
    # -1 takes all remaining devices.
    "mesh": {
        "data": Key(-1, "data-parallel axis size"),
        "fsdp": Key(1, "fully-sharded data-parallel axis size"),
        "tensor": Key(1, "tensor-parallel axis size"),
        "expert": Key(1, "expert-parallel axis size (splits MoE experts over devices)"),
        "sampler_devices": Key(
            0,
            "> 0 gives the sampler the first this many devices (its own mesh, weights "
            "resharded onto it every step) and the trainer the rest",
        ),
    },
    # LoRA (rljax.models.lora): train low-rank adapters on these projections, base frozen.
    # On-policy distillation's teacher (`algorithm.name="on_policy_distillation"` or "gkd").
    "teacher": {
        "run_dir": Key(
            "",
            "the run directory of the teacher policy (its config.json and checkpoints); "
            "needed by an algorithm that reads teacher log-probs, refused by any other",
        ),
        "step": Key(-1, "the teacher's checkpoint step; -1: the newest", min=-1),
        "top_k": Key(
            0,
            "> 0: the teacher also sends its this many likeliest tokens per position (GKD's "
            "divergence reads them; 0 for algorithms that do not)",
            min=0,
        ),
    },
    "lora": {
        "rank": Key(
            0,
            "rank r of the adapters A [in, r], B [r, out]; only they are trained and "
            "checkpointed, the frozen base is the KL reference",
            min=0,
            hint="0: off, every parameter is trained",
        ),
        "alpha": Key(16.0, "the adapters' update is scaled by alpha / rank", gt=0),
        "targets": Key(
            ("q", "k", "v", "o"),
            "projections that get adapters: q, k, v, o (attention), gate, up, down (MLP and "
            "MoE experts)",
        ),
        "base_quant": Key(
            "none",
            "QLoRA: 'int8' stores the frozen base's projection kernels as int8 with "
            "per-output-channel scales (dequantized where used); the policy is that base",
            choices=("none", "int8"),
        ),
        "sampler": Key(
            "merged",
            "how the sampler applies the adapters: 'merged' into the weights once per rollout, "
            "or 'unmerged' as x W + scale (x A) B in each projection (same policy; speed only)",
            choices=("merged", "unmerged"),
        ),
    },
    # Episodic tasks only (multi-turn environments, rljax.train.episodes).
    "env": {
        "chat_format": Key(
            "plain",
            "layout of episode prompts and observations (rljax.envs.chat.CHAT_FORMATS)",
            choices=("plain", "chatml", "gemma"),
        ),
        "time_limit_s": Key(5.0, "limit on each environment call (reset, step)", gt=0),
        "workers": Key(8, "threads stepping environments while the engine decodes", min=1),
        "isolation": Key(
            "thread",
            "where environments run: the trainer's threads, or a child process each, killed "
            "at time_limit_s (rljax.envs.process_env)",
            choices=("thread", "process"),
        ),
        "overlap": Key(
            False,
            "decode while environments step (faster with slow ones; rollouts then depend on "
            "thread timing at float rounding, so reruns and resumes are not bit-exact)",
        ),
    },
    "critic": {
        "separate": Key(
            False,
            "PPO's critic: a value head on a separate copy of the initial policy instead of "
            "on the policy",
        ),
    },
}


def default_config() -> ConfigDict:
    """The complete default run config: every key of `SCHEMA` at its default.

    Open sections hold only their own keys (e.g. `algorithm.name`); the preset's, task's and
    correction's settings default to their signatures. A recipe starts here and sets what it
    chooses: `config = default_config(); config.train.steps = 10`.
    """
    return ConfigDict(
        {
            name: (
                {key: spec.default for key, spec in entry.items()}
                if isinstance(entry, dict)
                else entry.default
            )
            for name, entry in SCHEMA.items()
        }
    )


def config_from_json(stored: dict[str, Any]) -> ConfigDict:
    """The config a run stored as `config.json`, on top of `default_config()` (keys added to
    the schema since then take their defaults).

    JSON has no tuples, so a stored list becomes a tuple where the schema's default is one,
    and everywhere in the open sections (preset, task and correction settings are tuples in
    configs, e.g. `segment_po`'s `delimiter_ids`).
    """

    def tupled(value: Any) -> Any:
        return tuple(tupled(v) for v in value) if isinstance(value, list) else value

    config = default_config()
    for name, value in stored.items():
        entry = SCHEMA.get(name)
        if not isinstance(value, dict):
            config[name] = (
                tupled(value) if isinstance(getattr(entry, "default", None), tuple) else value
            )
            continue
        if name not in config:
            config[name] = {}
        for key, item in value.items():
            spec = entry.get(key) if isinstance(entry, dict) else None
            is_tuple = name in OPEN_SECTIONS or isinstance(getattr(spec, "default", None), tuple)
            config[name][key] = tupled(item) if is_tuple else item
    return config
