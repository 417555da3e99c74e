"""The recipe's schema: every group a training recipe sets (configs/train.yaml and its experiments). The
capture's schema extends it, so that a recipe means the same thing to both, and the pipeline keys its stages on
it; it sits below those stages, in the shared config room. The target, draft and data groups keep their schemas
next to their code (models/target_config.py, models/resolve.py, data/config.py); this file composes them and
adds the loop's own settings and the optimizer's (whose code is train/optim.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from omegaconf import MISSING

from blockdraft.data.config import DataConfig
from blockdraft.models.resolve import DraftConfig
from blockdraft.models.target_config import TargetConfig


@dataclass
class OptimConfig:
    name: str = "adamw"
    """adamw | muon (torch.optim.Muon for the 2-D weight matrices, AdamW for everything else)."""
    lr: float = 6e-4
    """Peak learning rate (with muon: of the AdamW group: norms, biases, other non-matrix parameters)."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay (with muon: of the AdamW group)."""
    betas: List[float] = field(default_factory=lambda: [0.9, 0.95])
    """AdamW's two moment decay rates."""
    warmup_ratio: float = 0.04
    """Share of max_steps spent warming up linearly from 0."""
    min_lr_ratio: float = 0.1
    """Cosine decays to lr * min_lr_ratio at max_steps."""
    grad_clip: float = 1.0
    """Clip the global grad norm to this; 0 disables."""
    muon_lr: Optional[float] = None
    """muon: peak learning rate of the matrix group; null = lr. Muon's updates are rescaled to
    AdamW's RMS (adjust_lr_fn=match_rms_adamw), so the two rates are on one scale."""
    muon_momentum: float = 0.95
    """muon: momentum of the matrix group's updates."""
    muon_weight_decay: float = 0.0
    """muon: decoupled weight decay of the matrix group."""
    muon_ns_steps: int = 5
    """Newton-Schulz iterations per Muon step (torch's default 5): fewer make a step cheaper on a CPU,
    where they dominate it, and orthogonalise the update less exactly."""
    muon_ns_dtype: str = "auto"
    """Dtype of Muon's Newton-Schulz iteration: auto (bfloat16, torch's own, on CUDA and on a CPU with
    AVX512-BF16 or AMX; float32 on other CPUs, where bfloat16 matmuls ran about 28x slower) | bfloat16 | float32."""


@dataclass
class LoopConfig:
    """Schema of `train`: the loop, the loss, and checkpoints."""

    max_steps: int = 1000
    """Optimizer steps."""
    max_minutes: Optional[float] = None
    """Training budget in minutes (the loop's time, summed over resumes): once spent, the run stops at its next
    checkpoint step, validates and saves as at max_steps, and records why; null = no limit (time_budget.py)."""
    micro_batch_size: int = 1
    """Rows per rank per forward."""
    grad_accum: int = 1
    """Micro-batches per rank per optimizer step (the global batch is micro_batch_size x grad_accum x ranks). A resume
    on another world size keeps the checkpoint's global batch and sets this to match, unless it is given on the
    command line."""
    num_anchors: int = 64
    """Blocks drawn per row."""
    loss_type: str = "block"
    """block | variable_prefix."""
    position_weighting: str = "decay"
    """Per-slot loss weights: decay (exp(-(k-1)/gamma)) | dpace (from the draft's own confidence, see losses.dpace_weights)."""
    gamma: Optional[float] = 7.0
    """decay: slot decay exp(-(k-1)/gamma); null = uniform."""
    loss_normalization: Optional[str] = None
    """What a micro-batch's weighted loss sum is divided by: weights (sum of the position weights) | blocks
    (blocks with a supervised slot) | tokens (supervised slots); null = the weighting's own default
    (decay: weights; dpace: tokens, measured in docs/benchmarks-history.md)."""
    dpace_alpha: float = 0.5
    """dpace: smoothing of each slot's confidence, alpha + (1 - alpha) p (0.5 is the paper's default)."""
    ce_weight: float = 1.0
    """Weight of the block CE against the hard labels (the data's next tokens)."""
    kl_weight: float = 0.0
    """Weight of the forward KL against the target's own next-token distribution (0 = off)."""
    teacher_top_k: Optional[int] = 32
    """The target's distribution is truncated to its k most likely tokens and renormalised; null or 0 = the
    full distribution online, computed in loss_chunk_size chunks (from a feature store: the top-k it kept)."""
    kl_temperature: float = 1.0
    """Temperature of both distributions in the KL (the KL is scaled by T^2)."""
    prefix_weight_base: float = 0.5
    """variable_prefix: P(prefix = l) proportional to base**(l-1)."""
    selector_loss_weight: float = 1.0
    """DFlash2: weight of the selector CE (0 = the DFlash loss); LiLiCorr: weight of the lattice path loss."""
    confidence_weight: float = 1.0
    """DSpark: weight of the confidence head's BCE (speculators' confidence_head_alpha, 1.0)."""
    confidence_target: str = "greedy"
    """DSpark: what the confidence head learns to predict per slot. greedy: the target's probability of the
    draft's argmax token, what vLLM realises with its default draft_sample_method=greedy (with hard labels, 1
    when the argmax is the label) | overlap: sum_v min(q_v, p_v), speculators' 1 - TV for sampled drafts
    (with hard labels, q(label))."""
    frozen: List[str] = field(default_factory=list)
    """Draft parameters kept as initialised: every parameter whose name contains one of these, e.g. [mlp] keeps the
    MLP copied from the target (init_from_target) and trains the rest; [] = train every parameter."""
    feature_noise_std: float = 0.0
    """Std of Gaussian noise added to the target's features while training (never in validation); 0 = off."""
    loss_chunk_size: int = 0
    """Slots per chunk of the vocabulary projection in the loss; 0 = all at once."""
    attention_backend: str = "auto"
    """auto (flex on CUDA, sdpa elsewhere) | sdpa | flex."""
    activation_checkpointing: bool = False
    """Recompute the draft's layers in backward: less memory for more anchors, ~1/3 more draft time."""
    dtype: str = "auto"
    """auto (bf16 autocast on CUDA, fp32 on CPU) | float32 | bfloat16."""
    log_every: int = 10
    """Steps between metric lines (metrics.jsonl, the terminal, wandb)."""
    val_every: int = 0
    """Steps between validations (0 = only at the end, when data.val is set)."""
    save_every: int = 0
    """Steps between checkpoints (0 = only at the end)."""
    keep_last: int = 3
    """Checkpoints kept; older ones are deleted after a successful save."""
    draft_sharding: str = "ddp"
    """How the draft spreads over the ranks. ddp: replicated, float32 weights, gradients and AdamW state on every
    rank (a checkpoint is model.safetensors written by rank 0) | fsdp: FSDP2, each rank holds 1/world of them, the
    draft gathered in train.dtype for each micro-step and its gradients reduced in float32; every rank writes its
    shards of the checkpoint (torch.distributed.checkpoint, draft/), which resumes on any world size and exports
    as a ddp one does. fsdp needs optim.name=adamw (docs/scaling-out.md)."""
    progress: bool = True
    """Progress bar on rank 0."""
    max_nonfinite_steps: int = 3
    """A step whose loss or gradient norm is not finite is skipped (nothing changes); this many in a row stop the run."""
    loader_workers: int = 2
    """Processes per rank that read and collate the next micro-batches while the step computes (pinned for the copy
    to a GPU); 0 = read them in the training thread. The batches, their order and the saved position are the same."""


@dataclass
class WandbConfig:
    mode: str = "disabled"
    """disabled | offline | online."""
    project: str = "blockdraft"
    """The wandb project the run is logged under."""
    name: Optional[str] = None
    """The wandb run's name; null = wandb's own."""
    dir: Optional[str] = None
    """Where wandb writes; null = <run_dir>/wandb."""


@dataclass
class PrepareConfig:
    """Data a recipe can make for itself when `data.train` does not exist yet."""

    regenerate_builtin: Optional[str] = None
    """Name of a built-in prompt set answered by the target into data.train / data.val (e.g. tiny_prompts)."""
    num_train: int = 64
    """regenerate_builtin: prompts answered into data.train."""
    num_val: int = 16
    """regenerate_builtin: prompts answered into data.val (after the training ones)."""
    max_new_tokens: int = 48
    """regenerate_builtin: most tokens of each reply."""


@dataclass
class DistributedConfig:
    target_sharding: str = "none"
    """none (every rank loads the whole target) | fsdp (built on the meta device, each rank reads only its shard of
    each decoder layer from the safetensors, layers gathered one at a time in the forward: no rank holds the whole
    target; docs/scaling-out.md)."""
    target_mesh: str = "global"
    """With target_sharding=fsdp: global (each layer sharded over every rank) | node (sharded over the ranks of a
    node, replicated across nodes: a layer's gathers stay on the node's links; docs/scaling-out.md)."""
    timeout_s: float = 600.0
    """How long a rank waits in a collective of a training step (and on a rank that stopped beating) before the
    run stops with the reason. A rank that is alive and busy with a chore others wait on is waited for."""
    startup_timeout_s: float = 1800.0
    """The same limit until the first optimizer step ends: loading a large target, compiling, first allocations."""
    lease_s: float = 120.0
    """The run directory's lock is a lease renewed every lease_s / 4 seconds by rank 0: a run on other hosts takes
    over a lock whose lease is older than this (the node that held it is lost), never a live one."""


@dataclass
class TrainAppConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    draft: DraftConfig = field(default_factory=DraftConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: LoopConfig = field(default_factory=LoopConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    prepare: PrepareConfig = field(default_factory=PrepareConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    run_dir: str = MISSING
    """Everything of the run lands here: config.yaml, metrics.jsonl, checkpoints/."""
    resume: str = "never"
    """never | auto (latest checkpoint if any) | must (fail if none) | a checkpoint path."""
    init_from_target: bool = False
    """Start the draft's layers, final norm and fc from the target's last layers (see models/init_from_target.py);
    from a feature store only those tensors are read from the target's safetensors."""
    overwrite: bool = False
    """Start afresh in a run_dir that already holds a run (its metrics and checkpoints are deleted)."""
    init_from: Optional[str] = None
    """An exported or imported draft directory to start from."""
    seed: int = 0
    """Seeds the draft's initial weights and the order and anchors of the training batches."""
    name: Optional[str] = None
    """The recipe's name (experiment files set it); recorded in metrics and the model card."""

    # Logging, progress, checkpoint cadence, memory and speed knobs: the same math, so the same draft. A rerun
    # that changes only these keeps the trained run (the pipeline's train key leaves them out). A resumed run
    # reproduces an uninterrupted one (tests/faults), which is why save_every and keep_last are here.
    OUTPUT_NEUTRAL = ("train.log_every", "train.save_every", "train.keep_last", "train.progress",
                      "train.max_nonfinite_steps", "train.attention_backend", "train.activation_checkpointing",
                      "train.loss_chunk_size", "train.loader_workers", "distributed.target_sharding", "distributed.target_mesh",
                      "distributed.timeout_s", "distributed.startup_timeout_s", "distributed.lease_s", "wandb", "data.cache_dir",
                      "data.tokenize_workers", "resume", "overwrite", "name")
    # How far the run goes: a larger value continues the run from its last checkpoint instead of starting anew.
    EXTENT = ("train.max_steps", "train.max_minutes")
    # What a resume takes from the new config (train/loop.py _continue_schedule; the clip is read every step): a run
    # that stopped part way (on non-finite steps, say) continues from its last checkpoint under a change of
    # these, where a finished run changed in them is a new run.
    RESUMABLE = ("optim.lr", "optim.muon_lr", "optim.grad_clip")
