"""Runs verl 0.9.1's `core_algos` and `rollout_corr_helper` on given inputs (a subprocess of
verl_reference.py).

Usage: python verl_runner.py SITE CALLS.pkl OUT.pkl. SITE holds verl installed with --no-deps;
each call is a policy loss (its name, ActorConfig fields and inputs), a rollout rejection
mask or rollout IS weights (their options and inputs). verl's package
`__init__` (which imports ray and the trainer) is bypassed and ray is stubbed: `core_algos`
needs neither.
"""

import importlib
import importlib.machinery
import pickle
import sys
import types


class _Stub(types.ModuleType):
    """A module whose every attribute is an inert class (ray's decorators and types)."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return type(name, (), {"__init__": lambda self, *a, **k: None})


def _load(site: str):
    sys.path.insert(0, site)
    ray = _Stub("ray")
    ray.__path__, ray.__spec__ = [], importlib.machinery.ModuleSpec("ray", None)
    sys.modules["ray"] = ray
    verl = types.ModuleType("verl")
    verl.__path__ = [f"{site}/verl"]
    sys.modules["verl"] = verl
    core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
    from verl.workers.config import ActorConfig

    rollout_corr = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
    return core_algos, ActorConfig, rollout_corr


def _policy_loss(core_algos, actor_config, call):
    import torch

    x = {k: torch.tensor(v) for k, v in call["inputs"].items()}
    log_prob = x["log_prob"].clone().requires_grad_(True)
    fields = {"strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 1}
    config = actor_config(**fields, **call["config"])
    loss, metrics = core_algos.get_policy_loss_fn(call["name"])(
        old_log_prob=x["old_log_prob"],
        log_prob=log_prob,
        advantages=x["advantages"],
        response_mask=x["response_mask"],
        loss_agg_mode=call["loss_agg_mode"],
        config=config,
    )
    (grad,) = torch.autograd.grad(loss, log_prob)
    return {"loss": loss.item(), "grad": grad.numpy(), "metrics": metrics}


def _rollout_correction(rollout_corr, call):
    import torch

    x = {k: torch.tensor(v) for k, v in call["inputs"].items()}
    if call["kind"] == "rejection":
        mask, metrics = rollout_corr.compute_rollout_rejection_mask(
            log_ratio=x["log_ratio"], response_mask=x["response_mask"], **call["options"]
        )
        return {"mask": mask.numpy(), "metrics": metrics}
    weights, metrics = rollout_corr.compute_rollout_correction_weights(
        log_ratio=x["log_ratio"], response_mask=x["response_mask"], **call["options"]
    )
    return {"weights": weights.numpy(), "metrics": metrics}


def _gdpo(core_algos, call):
    import numpy as np
    import torch

    x = call["inputs"]
    rewards, mask = x["rewards"], torch.tensor(x["response_mask"])
    names = [f"reward_{k}" for k in range(rewards.shape[1])]
    attention = torch.cat([torch.ones(rewards.shape[0], 1), mask], 1)
    b = rewards.shape[0]
    advantages, _ = core_algos.compute_gdpo_outcome_advantage(
        token_level_rewards=torch.zeros_like(mask),
        response_mask=mask,
        index=np.asarray(x["index"]),
        norm_adv_by_std_in_grpo=call["normalize_std"],
        config={"gdpo_reward_keys": names, "gdpo_reward_weights": call["weights"]},
        non_tensor_batch={name: rewards[:, k] for k, name in enumerate(names)},
        batch={
            "prompts": torch.zeros(b, 1),
            "attention_mask": attention.long(),
        },
    )
    return {"advantages": advantages.numpy()}


def _otb(core_algos, call):
    import numpy as np
    import torch

    x = call["inputs"]
    fn = (
        core_algos.compute_multi_turn_optimal_token_baseline_advantage
        if call["multi_turn"]
        else core_algos.compute_optimal_token_baseline_advantage
    )
    advantages, _ = fn(
        token_level_rewards=torch.tensor(x["token_rewards"]),
        response_mask=torch.tensor(x["response_mask"]),
        index=np.asarray(x["index"]),
        old_log_probs=torch.tensor(x["old_log_prob"]),
        sum_pi_squared=torch.tensor(x["sum_pi_squared"]),
        handle_zero_tail=call["handle_zero_tail"],
    )
    return {"advantages": advantages.numpy()}


def main(site: str, calls_path: str, out_path: str) -> None:
    core_algos, actor_config, rollout_corr = _load(site)
    with open(calls_path, "rb") as f:
        calls = pickle.load(f)
    answer = {
        "policy_loss": lambda call: _policy_loss(core_algos, actor_config, call),
        "rejection": lambda call: _rollout_correction(rollout_corr, call),
        "is_weights": lambda call: _rollout_correction(rollout_corr, call),
        "gdpo": lambda call: _gdpo(core_algos, call),
        "otb": lambda call: _otb(core_algos, call),
    }
    results = [answer[call["kind"]](call) for call in calls]
    with open(out_path, "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
