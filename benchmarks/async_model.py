"""A discrete-event model of synchronous, ordered-stale and overlapped RL steps, checked against
runs on this machine and used to predict steps/s for a pod-sized sampler/trainer split.

On 8 fake CPU devices the sampler and the trainer share the same two cores, so overlap can
only hide host work (Python dispatch, scoring, logging) here, not device time. What can be
checked here is the schedule: fed the busy times an overlapped run measured (`sampler/busy_s`,
the timeline's trainer intervals, the handoff), the model should predict that run's step
period (the time between the trainer's requests for consecutive batches, measured alike for
every schedule). The runs alternate (each schedule twice) and the medians are kept.

What cannot be checked here is the prediction for disjoint hardware. There the sampler's share
f of the devices takes reward_s + generation_s * f^-alpha and the trainer's takes
trainer_s / (1 - f), from a profile measured on all devices. With alpha = 1 (generation scales
perfectly) no split beats the synchronous loop on all devices except by the host work it hides;
the gain comes from generation scaling worse than the update (alpha < 1: decoding is
bandwidth- and latency-bound, its long tail does not shrink with more chips). It is quoted as
a prediction for alpha = 1, 0.5 and 0.

  XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m benchmarks.async_model

Writes benchmarks/results/async_model.json and prints the tables.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time

from benchmarks.rollout import machine

RESULTS = os.path.join(os.path.dirname(__file__), "results", "async_model.json")
STEPS, SKIP = 14, 4  # steps run, first steps left out of the medians (compilation)
SPLITS = tuple(i / 16 for i in range(1, 16))
ALPHAS = (1.0, 0.5, 0.0)
# Issue 31's SmolLM2-135M GRPO step on this machine (2 cores, float32), seconds: generation and
# reward on the sampler's side, the old-log-prob pass, update and host work on the trainer's.
SMOLLM2_PROFILE = {"generation_s": 11.4, "reward_s": 0.3, "trainer_s": 8.6 + 29.9}
SMOLLM2_PARAMS_GB = 0.54  # float32
POD_LINK_GB_PER_S = 50.0  # an assumed device-to-device bandwidth for the handoff
SCHEDULES = {
    "synchronous": {},
    "ordered_stale": {"k": 1},
    "overlapped_shared_devices": {"k": 1, "overlap": "free"},
    "ordered_stale_sampler_devices_4": {"k": 1, "sampler_devices": 4},
    "overlapped_sampler_devices_4": {"k": 1, "overlap": "free", "sampler_devices": 4},
}


def simulate(
    sampler_s: float,
    trainer_s: float,
    handoff_s: float,
    steps: int,
    max_staleness: int,
    overlapped: bool,
) -> list[float]:
    """The time each step ends, from a start at 0.

    Args:
      sampler_s: one batch's rollout and scoring on the sampler's devices.
      trainer_s: one step's work on the trainer's side (prepare, update, logging).
      handoff_s: publishing the weights to the sampler, at the start of every step.
      steps: how many steps.
      max_staleness: K; batch i may start once version max(i - K, 0) is published.
      overlapped: the sampler runs ahead on its own (else each step samples, then trains).
    """
    ends: list[float] = []
    publish: list[float] = []  # when version i is published (the start of step i)
    sampled = trained = 0.0  # when the sampler finished its last batch; the trainer its step
    for i in range(steps):
        publish.append(trained + handoff_s)
        if overlapped:
            start = max(sampled, publish[max(i - max_staleness, 0)])
            sampled = start + sampler_s
            trained = max(publish[i], sampled) + trainer_s
        else:
            trained = publish[i] + sampler_s + trainer_s
        ends.append(trained)
    return ends


def step_time(ends: list[float], skip: int = SKIP) -> float:
    """The steady step time: the mean spacing of the ends after the first `skip`."""
    return (ends[-1] - ends[skip - 1]) / (len(ends) - skip)


class _Clock:
    """Wraps a collector and notes when the trainer asks for each batch."""

    def __init__(self, inner, asked: list[float]):
        self.inner, self.asked = inner, asked

    def collect(self, state, step):
        self.asked.append(time.perf_counter())
        return self.inner.collect(state, step)

    def state(self):
        return self.inner.state()

    def load(self, state):
        self.inner.load(state)


def measure(run_dir: str, **settings) -> dict[str, float]:
    """One short run of the addition task with a small model: its step period and the
    medians of its phases."""
    from configs.grpo_addition import get_config
    from rljax.train.loop import train

    config = get_config()
    config.model.update(d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128)
    config.sft.steps = 0
    config.task.eval_size = 8
    config.rollout.n_samples = 4
    config.train.update(steps=STEPS, prompts_per_step=16, eval_every=STEPS)
    config.train.update(checkpoint_every=STEPS, max_staleness=settings.get("k", 0))
    config.train.overlap = settings.get("overlap", "off")
    config.mesh.sampler_devices = settings.get("sampler_devices", 0)
    config.run_dir = run_dir
    asked: list[float] = []
    records = train(config, wrap_collector=lambda c: _Clock(c, asked))
    records = [r for r in records if r["step"] > SKIP]
    median = lambda key: statistics.median(r.get(key, 0.0) for r in records)  # noqa: E731
    periods = [b - a for a, b in zip(asked[SKIP - 1 : -1], asked[SKIP:])]
    out = {"period_s": statistics.median(periods)}
    out |= {
        k: median(f"time/{k}")
        for k in ("step_s", "rollout_s", "reward_s", "old_logprobs_s", "update_s", "other_s")
    }
    if config.train.overlap != "off":
        with open(os.path.join(run_dir, "timeline.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        busy = [x["end"] - x["start"] for x in lines if x["role"] == "trainer"][SKIP:]
        out.update(
            sampler_busy_s=median("sampler/busy_s"),
            trainer_busy_s=statistics.median(busy),
            handoff_s=median("overlap/handoff_s"),
            wait_s=median("overlap/wait_s"),
        )
    return out


def pod_split(profile: dict[str, float], handoff_s: float, alpha: float, k: int) -> dict:
    """The best sampler share of a pod for a profile measured on all of its devices, and the
    predicted speedup of the overlapped loop there over the synchronous loop on all devices."""
    sync = profile["generation_s"] + profile["reward_s"] + profile["trainer_s"]
    best = None
    for share in SPLITS:
        sampler_s = profile["reward_s"] + profile["generation_s"] * share**-alpha
        trainer_s = profile["trainer_s"] / (1 - share)
        step = step_time(simulate(sampler_s, trainer_s, handoff_s, 60, k, True), skip=20)
        if best is None or step < best["step_s"]:
            best = {"sampler_share": share, "step_s": step, "speedup_vs_synchronous": sync / step}
    return best


def main() -> None:
    measured: dict[str, list[dict[str, float]]] = {name: [] for name in SCHEDULES}
    with tempfile.TemporaryDirectory() as root:
        for repeat in range(2):  # alternating: A B C D E A B C D E
            for name, settings in SCHEDULES.items():
                run = measure(os.path.join(root, f"{name}_{repeat}"), **settings)
                measured[name].append(run)
                print(name, {k: round(v, 4) for k, v in run.items()})
    medians = {
        name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        for name, runs in measured.items()
    }
    checks = {}
    for name in ("overlapped_shared_devices", "overlapped_sampler_devices_4"):
        m = medians[name]
        ends = simulate(m["sampler_busy_s"], m["trainer_busy_s"], m["handoff_s"], STEPS, 1, True)
        checks[name] = {"measured_period_s": m["period_s"], "model_period_s": step_time(ends)}
    handoff = SMOLLM2_PARAMS_GB / POD_LINK_GB_PER_S
    pod = {
        f"alpha_{alpha}_k{k}": pod_split(SMOLLM2_PROFILE, handoff, alpha, k)
        for alpha in ALPHAS
        for k in (1, 2)
    }
    result = {
        "machine": machine(),
        "load_average": os.getloadavg(),
        "steps": STEPS,
        "median_after_step": SKIP,
        "measured": measured,
        "medians": medians,
        "model_checks": checks,
        "pod_prediction_smollm2_profile": pod,
        "assumptions": {
            "profile_s": SMOLLM2_PROFILE,
            "params_gb": SMOLLM2_PARAMS_GB,
            "pod_link_gb_per_s": POD_LINK_GB_PER_S,
            "scaling": "sampler: reward_s + generation_s * share^-alpha; trainer: / (1 - share)",
        },
    }
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS, "w") as f:
        json.dump(result, f, indent=2)
    for name, m in medians.items():
        print(f"{name:34s} period {m['period_s']:.4f} s")
    print(json.dumps(checks, indent=2))
    print(json.dumps(pod, indent=2))


if __name__ == "__main__":
    main()
