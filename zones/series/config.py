"""What determines a trained model: ``TrainConfig``, the named profiles and the series they make."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable

from zones.core.checks import check_choice, check_float, check_int

VERSION = "train-2"  # part of every run's cache key: bump when training changes its results
PRECISIONS = ("fp32", "bf16")


@dataclass(frozen=True)
class TrainConfig:
    """Everything that determines a trained model. Sizes are plain parameters.

    ``width=None`` means ``width_per_layer * depth`` (the paper keeps width/depth fixed).
    ``warmup_steps=None`` means 10 % of ``steps``. ``precision`` is ``fp32`` or ``bf16``
    (bf16 autocast for the forward pass; weights and optimizer stay in fp32; refused on a
    device without native bf16, see ``zones.core.hardware.check_precision``). ``threads``: the
    CPU threads torch runs the run's operations on. It is part of the run because a CPU run's
    bits depend on it (reductions split across threads round differently), so a run trains
    alike on a 2-core laptop and a 64-core server; one thread each lets runs train side by
    side, one per core (``zones.series.pool``).
    """

    depth: int
    width: int | None = None
    width_per_layer: int = 16
    head_dim: int = 16
    mlp_ratio: int = 4
    vocab_size: int = 4096
    seq_len: int = 128
    batch_size: int = 16
    steps: int = 400
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int | None = None
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = 1.0
    seed: int = 0
    corpus: str = "stdlib-code"
    heldout_every: int = 20
    eval_every: int = 25
    eval_windows: int = 32
    snapshot_every: int = 25
    early_snapshot_every: int = 0    # denser snapshots early in training, where a compression wave would run (0: none)
    early_snapshot_until: int = 0    # ... up to and including this step
    checkpoint_every: int = 50
    precision: str = "fp32"
    threads: int = 1

    def is_snapshot(self, step: int) -> bool:
        """Whether the loop takes a spectral snapshot after ``step``: every ``snapshot_every`` steps,
        every ``early_snapshot_every`` steps up to ``early_snapshot_until``, and at the last step."""
        early = self.early_snapshot_every and step <= self.early_snapshot_until and step % self.early_snapshot_every == 0
        return bool(step % self.snapshot_every == 0 or step == self.steps or early)

    def snapshot_text(self) -> str:
        """The snapshot schedule in words: "every 48 steps (every 8 up to step 64)"."""
        early = (f" (every {self.early_snapshot_every} up to step {self.early_snapshot_until})"
                 if self.early_snapshot_every and self.early_snapshot_until else "")
        return f"every {self.snapshot_every} steps{early}"

    def __post_init__(self):
        for name in ("depth", "width_per_layer", "head_dim", "mlp_ratio", "batch_size", "steps",
                     "eval_every", "eval_windows", "snapshot_every", "checkpoint_every", "threads"):
            check_int(getattr(self, name), name, min=1)
        check_int(self.seq_len, "seq_len", min=2)
        check_int(self.vocab_size, "vocab_size (256 bytes + specials)", min=260)
        check_int(self.heldout_every, "heldout_every", min=2)
        check_int(self.early_snapshot_every, "early_snapshot_every", min=0)
        check_int(self.early_snapshot_until, "early_snapshot_until", min=0)
        check_int(self.seed, "seed", min=0)
        if self.width is not None:
            check_int(self.width, "width", min=1)
        if self.warmup_steps is not None:
            check_int(self.warmup_steps, "warmup_steps (in [0, steps))", min=0, max=self.steps - 1)
        check_float(self.lr, "lr", min=0, min_inclusive=False)
        check_float(self.min_lr_ratio, "min_lr_ratio", min=0, max=1)
        check_float(self.weight_decay, "weight_decay", min=0)
        check_float(self.grad_clip, "grad_clip (0 = no clipping)", min=0)
        betas = self.betas
        if (isinstance(betas, (str, bytes)) or not hasattr(betas, "__len__") or len(betas) != 2):
            raise ValueError(f"betas must be two numbers in [0, 1), e.g. betas=[0.9, 0.95]; got {betas!r}")
        for beta in betas:
            check_float(beta, "betas (two numbers in [0, 1))", min=0, max=1, max_inclusive=False)
        object.__setattr__(self, "betas", (float(betas[0]), float(betas[1])))
        if not isinstance(self.corpus, str) or not self.corpus:
            raise ValueError(f"corpus must be a corpus name or a path; got {self.corpus!r}")
        if self.hidden_size % self.head_dim:
            raise ValueError(f"width {self.hidden_size} must be a positive multiple of head_dim {self.head_dim}")
        check_choice(self.precision, "precision", PRECISIONS)

    @property
    def hidden_size(self) -> int:
        return self.width if self.width is not None else self.width_per_layer * self.depth

    @property
    def n_heads(self) -> int:
        return self.hidden_size // self.head_dim

    @property
    def warmup(self) -> int:
        return self.warmup_steps if self.warmup_steps is not None else max(1, self.steps // 10)

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "betas": list(self.betas)}


# Each profile fills the fields it names; the rest keep TrainConfig's defaults. ``depths`` are
# the series' depths and ``seeds`` the number of training seeds of each depth (seeds 0..n-1: one
# count for every depth, or a dict depth -> count).
PROFILES: dict[str, dict[str, Any]] = {
    # The paper's depths D8/D12/D16 at a CPU width (width_per_layer chosen by measurement, see
    # book/methods/training.md), three seeds at every depth: the Δα exponent's rule reaches a power of
    # 0.93 with 3 + 3 + 3 runs (Methods' operating table; 0.34 with the 2 + 1 + 1 of earlier builds).
    "cpu": dict(depths=(8, 12, 16), seeds=3, width_per_layer=8, head_dim=16,
                vocab_size=1024, seq_len=128, batch_size=16, steps=240, lr=3e-3, eval_every=24, eval_windows=32,
                snapshot_every=48, early_snapshot_every=8, early_snapshot_until=64, checkpoint_every=120),
    # A tiny series for a class (zones book --budget class): D4/D6/D8 at width 8·depth, two seeds
    # of D4 (so that seeds can be compared) and one of the others, half the cpu profile's steps.
    "class": dict(depths=(4, 6, 8), seeds={4: 2, 6: 1, 8: 1}, width_per_layer=8, head_dim=16, vocab_size=1024,
                  seq_len=128, batch_size=16, steps=120, lr=3e-3, eval_every=24, eval_windows=16,
                  snapshot_every=24, early_snapshot_every=8, early_snapshot_until=40, checkpoint_every=60),
    # The paper's series D8/D12/D16 at width 64·depth (512, 768, 1024), for a GPU.
    "paper": dict(depths=(8, 12, 16), seeds=1, width_per_layer=64, head_dim=64, vocab_size=5120,
                  seq_len=512, batch_size=32, steps=2000, lr=6e-4, eval_windows=64, checkpoint_every=250,
                  early_snapshot_every=5, early_snapshot_until=100,
                  precision="bf16"),
}
SERIES_KEYS = ("depths", "seeds")  # profile entries that shape the series, not one config


def _check_profile(profile: str) -> None:
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")


def profile_depths(profile: str = "cpu") -> tuple[int, ...]:
    """The depths a profile's series trains."""
    _check_profile(profile)
    return tuple(PROFILES[profile]["depths"])


def profile_seeds(profile: str = "cpu", depth: int | None = None) -> tuple[int, ...]:
    """The training seeds a profile trains at ``depth``: 0..n-1, n its count for that depth
    (for every depth when the profile gives one count)."""
    _check_profile(profile)
    count = PROFILES[profile].get("seeds", 1)
    if isinstance(count, dict):
        count = count.get(depth, 1)
    return tuple(range(int(count)))


def profile_config(profile: str = "cpu", depth: int | None = None, **overrides) -> TrainConfig:
    """The ``TrainConfig`` of one depth of a profile, with any field overridden."""
    _check_profile(profile)
    settings = {k: v for k, v in PROFILES[profile].items() if k not in SERIES_KEYS}
    known = {f.name for f in fields(TrainConfig)} - {"depth"}
    unknown = sorted(set(overrides) - known)
    if unknown:
        raise ValueError(f"unknown training parameter(s) {unknown}; known: {sorted(known)}")
    settings.update({k: v for k, v in overrides.items() if v is not None})
    if depth is None:
        depth = PROFILES[profile]["depths"][0]
    return TrainConfig(depth=check_int(depth, "depth", min=1), **settings)  # validates every field


def series_configs(profile: str = "cpu", depths: Iterable[int] | None = None,
                   seeds: int | None = None, **overrides) -> list[TrainConfig]:
    """One config per (depth, seed): the profile's depths and seeds unless given. ``seeds`` is a
    count: seeds 0..seeds-1 at every depth (None: the profile's count per depth); one training
    seed ``seed=S`` among the overrides trains that seed alone at every depth."""
    if "depth" in overrides:
        raise ValueError("give the depths as depths=[...], not as the training parameter 'depth'")
    chosen = None if seeds is None else tuple(range(check_int(seeds, "seeds (a count: seeds 0..n-1)", min=1)))
    if overrides.get("seed") is not None:  # one seed for every depth
        if seeds is not None:
            raise ValueError(f"give either seeds (a count) or the training parameter seed, not both; got "
                             f"seeds={seeds!r} and seed={overrides['seed']!r}")
        chosen = (check_int(overrides["seed"], "seed", min=0),)
    overrides.pop("seed", None)
    depths = profile_depths(profile) if depths is None else tuple(check_int(d, "depths", min=1) for d in depths)
    if not depths:
        raise ValueError("depths must list at least one depth; got []")
    return [profile_config(profile, depth, seed=seed, **overrides)
            for depth in depths for seed in (chosen or profile_seeds(profile, depth))]


def parameter_count(config: TrainConfig) -> int:
    """Number of parameters of the model ``config`` builds (embeddings included, untied)."""
    d, L, V, m = config.hidden_size, config.depth, config.vocab_size, config.mlp_ratio
    per_block = (3 * d * d + 3 * d) + (d * d + d) + (m * d * d + m * d) + (m * d * d + d) + 4 * d
    return 2 * V * d + L * per_block + 2 * d


def flops_per_token(config: TrainConfig) -> float:
    """Training FLOPs per token: 6·N (forward and backward through every parameter) plus the
    attention scores and values, 12·depth·width·seq_len (PaLM's appendix B accounting)."""
    return 6.0 * parameter_count(config) + 12.0 * config.depth * config.hidden_size * config.seq_len
