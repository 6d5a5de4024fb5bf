"""rljax: JAX-native reinforcement-learning post-training for language models."""

from setuptools import find_packages, setup

# Other projects' environment APIs (rljax.envs.gymnasium_env, rljax.envs.skyrl_gym_env), pinned:
# the adapters are tested against these versions.
ENV_ADAPTERS = ["gymnasium==1.4.0", "skyrl-gym==0.4.0"]
# Metrics backends (rljax.metrics.backends), pinned: the tests read their stores at these versions.
WANDB = ["wandb==0.31.0"]
# MLflow's SQLite store (its file store is in maintenance mode) needs SQLAlchemy and Alembic,
# which mlflow-skinny leaves out.
MLFLOW = ["mlflow-skinny==3.18.0", "sqlalchemy==2.1.9", "alembic==1.20.1"]
# Hugging Face's symbolic math grader (rljax.rewards.math_verify), pinned: compared against ours
# in benchmarks/math_graders.py.
MATH = ["math-verify==0.9.0"]

setup(
    name="rljax",
    version="0.1.0",
    description="JAX-native RL post-training of language models, built from pure composable transforms.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["rljax", "rljax.*"]),  # configs/, launchers/: repo folders
    install_requires=[
        "jax>=0.10.2",
        "flax>=0.12.8",
        "optax>=0.2.8",
        "orbax-checkpoint>=0.12.8",
        "grain>=0.2.18",
        "array-record>=0.8.6",  # local data sets as ArrayRecord files (rljax.data.array_record)
        "pyarrow>=26.0.1",  # local parquet data sets
        "tensorflow-datasets>=4.9.10",
        "chex>=0.1.92",
        "absl-py>=2.5.1",
        "ml-collections>=1.1.0",
        "numpy>=2.0",
        "safetensors>=0.4.3",
        "tokenizers>=0.20",
        "tensorboardX>=2.6",
        "tqdm>=4.66",
        "gguf>=0.17",  # GGUF checkpoints (llama.cpp's format)
        "jinja2>=3.1.6",  # chat templates
        "matplotlib>=3.8",  # rljax report's dashboard
    ],
    entry_points={"console_scripts": ["rljax=rljax.cli:main"]},
    extras_require={
        "test": [
            "pytest>=8.0",
            "pytest-xdist>=3.6",  # make test runs the suite on 2 workers
            "hypothesis>=6.100",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            "matplotlib>=3.8",
            "scipy>=1.13",  # exact integrals and chi-square tests (tests/diffusion)
            "ruff>=0.6",
            *ENV_ADAPTERS,
            *WANDB,
            *MLFLOW,
            "datasets==5.2.0",  # writes the save_to_disk directories LocalTask reads
            "importlib_resources==7.1.0",  # TFDS needs it to prepare the tests' tiny data set
            *MATH,
        ],
        "envs": ENV_ADAPTERS,
        "wandb": WANDB,
        "mlflow": MLFLOW,
        "math": MATH,
        # Parity tests against Hugging Face transformers on the CPU torch wheel.
        "hf": [
            "torch==2.13.0",
            "transformers>=4.50",
            "accelerate>=1.0",  # transformers refuses to load GGUF files without it
        ],
    },
)
