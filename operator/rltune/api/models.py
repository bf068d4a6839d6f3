"""The RLTuningJob spec and the trial contract, as pydantic models.

These models are the single source of truth: the CRD's OpenAPI schema is generated from them
(`make crd`), the operator parses custom objects with them, and `rltune plan/tune --local` reads
the same YAML a user applies to the cluster. Field names are the camelCase names users write;
Python attributes are snake_case.

Only performance knobs live in `RLConfig`. Algorithm parameters (prompts per step, samples per
prompt, lengths, learning rate, loss) sit in `TaskSpec` and are never changed by the tuner:
changing the experiment is not a speed-up.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from .presets import PRESETS


class CamelModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def dump(self) -> dict:
        """The object as a user writes it (camelCase, no unset optionals)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def read_document(path: str) -> Any:
    """A spec file as data: YAML for .yaml/.yml, JSON otherwise (manifests, trial specs)."""
    with open(path) as f:
        text = f.read()
    if path.endswith((".yaml", ".yml")):
        import yaml

        return yaml.safe_load(text)
    import json

    return json.loads(text)


# --------------------------------------------------------------------------- workload


class ModelSpec(CamelModel):
    """A model architecture, by preset name and/or config.json-level fields (fields override the preset)."""

    preset: Optional[str] = Field(None, description=f"Architecture preset; one of {sorted(PRESETS)}.")
    layers: Optional[int] = Field(None, ge=1, description="Transformer layers (num_hidden_layers).")
    dense_layers: Optional[int] = Field(
        None, ge=0, description="Leading dense layers of an MoE model (first_k_dense_replace)."
    )
    hidden: Optional[int] = Field(None, ge=1, description="Hidden size (hidden_size).")
    heads: Optional[int] = Field(None, ge=1, description="Query heads (num_attention_heads).")
    kv_heads: Optional[int] = Field(None, ge=1, description="Key/value heads (num_key_value_heads).")
    head_dim: Optional[int] = Field(None, ge=1, description="Dimension of one attention head.")
    ffn: Optional[int] = Field(None, ge=0, description="Dense FFN size (intermediate_size); 0 for all-MoE.")
    experts: Optional[int] = Field(None, ge=0, description="Routed experts per MoE layer; 0 for dense.")
    active_experts: Optional[int] = Field(None, ge=0, description="Routed experts per token (top-k).")
    shared_experts: Optional[int] = Field(None, ge=0, description="Shared experts per MoE layer.")
    expert_ffn: Optional[int] = Field(None, ge=0, description="FFN size of one expert.")
    kv_lora_rank: Optional[int] = Field(
        None, ge=0, description="MLA compressed KV dimension; set for DeepSeek-style latent attention."
    )
    rope_head_dim: Optional[int] = Field(None, ge=0, description="MLA decoupled RoPE dimension.")
    vocab: Optional[int] = Field(None, ge=1, description="Vocabulary size.")
    dtype: Literal["bf16", "fp16", "fp32"] = Field("bf16", description="Weight and activation dtype.")

    @model_validator(mode="after")
    def _known_preset(self) -> "ModelSpec":
        if self.preset is not None and self.preset not in PRESETS:
            raise ValueError(
                f"workload.model.preset {self.preset!r} is unknown: use one of {sorted(PRESETS)} "
                "or give the architecture fields"
            )
        return self

    def resolved(self) -> "ModelArch":
        base = dict(PRESETS[self.preset]) if self.preset else {}
        base.update({k: v for k, v in self.model_dump(by_alias=True, exclude={"preset"}).items() if v is not None})
        missing = [f for f in ("layers", "hidden", "heads", "vocab") if f not in base]
        if missing:
            raise ValueError(
                f"workload.model lacks {', '.join(missing)}: give a preset or every architecture field"
            )
        return ModelArch.model_validate(base | {"name": self.preset or "custom"})


class ModelArch(CamelModel):
    """A fully resolved architecture, with the public arithmetic both the twin and the forecaster use."""

    name: str = "custom"
    layers: int
    dense_layers: int = 0
    hidden: int
    heads: int
    kv_heads: int = 0
    head_dim: int = 0
    ffn: int = 0
    experts: int = 0
    active_experts: int = 0
    shared_experts: int = 0
    expert_ffn: int = 0
    kv_lora_rank: int = 0
    rope_head_dim: int = 0
    vocab: int
    dtype: str = "bf16"

    @model_validator(mode="after")
    def _defaults(self) -> "ModelArch":
        if not self.kv_heads:
            self.kv_heads = self.heads
        if not self.head_dim:
            self.head_dim = self.hidden // self.heads
        return self

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def bytes_per_param(self) -> int:
        return 4 if self.dtype == "fp32" else 2

    def attn_params(self) -> int:
        q = self.hidden * self.heads * self.head_dim
        if self.is_mla:
            kv = self.hidden * (self.kv_lora_rank + self.rope_head_dim) + self.kv_lora_rank * self.heads * 2 * self.head_dim
        else:
            kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return q + kv + o

    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    def params(self) -> tuple[float, float]:
        """(total, active) parameter counts."""
        dense_ffn = 3 * self.hidden * self.ffn
        expert = 3 * self.hidden * self.expert_ffn
        n_dense = self.layers - self.moe_layers()
        total = self.layers * self.attn_params() + n_dense * dense_ffn
        active = total
        if self.is_moe:
            total += self.moe_layers() * (self.experts + self.shared_experts) * expert
            active += self.moe_layers() * (self.active_experts + self.shared_experts) * expert
        emb = 2 * self.vocab * self.hidden
        return float(total + emb), float(active + emb)

    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes per token across all layers (latent KV for MLA)."""
        if self.is_mla:
            per_layer = self.kv_lora_rank + self.rope_head_dim
        else:
            per_layer = 2 * self.kv_heads * self.head_dim
        return float(per_layer * self.layers * self.bytes_per_param)


class TaskSpec(CamelModel):
    """The RL experiment. The tuner never changes these: they define the algorithm, not its speed."""

    kind: Literal["math", "agentic-coding"] = Field(
        "math", description="math: DAPO-style single-turn reasoning; agentic-coding: multi-turn tool use."
    )
    prompts_per_step: int = Field(512, ge=1, description="Prompts per RL step (train batch size).")
    samples_per_prompt: int = Field(16, ge=1, description="Responses sampled per prompt (GRPO group size, n).")
    max_prompt_tokens: int = Field(1024, ge=1, description="Maximum prompt length in tokens.")
    max_response_tokens: int = Field(20480, ge=1, description="Maximum response length in tokens (per turn budget summed).")
    mean_response_tokens: Optional[int] = Field(
        None, ge=1, description="Hint: mean generated tokens per sample; default 1/4 of the maximum."
    )
    response_length_cv: Optional[float] = Field(
        None, gt=0, description="Hint: coefficient of variation of response lengths (long tail); default 1.0."
    )
    turns: Optional[int] = Field(None, ge=1, description="Agentic coding: mean turns per episode.")
    tool_latency_seconds: Optional[float] = Field(
        None, ge=0, description="Agentic coding: mean tool/test execution time per turn, in seconds."
    )
    sandboxes: Optional[int] = Field(None, ge=1, description="Agentic coding: concurrent sandboxes available.")


class EnvVar(CamelModel):
    name: str = Field(description="Environment variable name.")
    value: str = Field("", description="Environment variable value.")


class Workload(CamelModel):
    framework: Literal["verl", "openrlhf", "reference", "twin"] = Field(
        "twin",
        description="RL framework the trials run: reference = rltune's own GRPO loop (vLLM + torch), "
        "twin = the digital twin (simulated GPU cluster), verl/openrlhf = the user's framework via adapters.",
    )
    image: str = Field("ghcr.io/rltune/trial:0.1.0", description="Container image of the trial workload.")
    command: Optional[list[str]] = Field(None, description="Container command; default: the image's entry point.")
    args: Optional[list[str]] = Field(None, description="Container args, before the rendered knobs.")
    env: Optional[list[EnvVar]] = Field(None, description="Extra environment variables for trial pods.")
    model: ModelSpec = Field(description="The policy model's architecture.")
    task: TaskSpec = Field(default_factory=TaskSpec, description="The RL task and batch shape (never tuned).")
    scenario: Optional[dict[str, Any]] = Field(
        None,
        description="Twin only: overrides of the simulated cluster's hidden efficiency factors and noise.",
    )


class Resources(CamelModel):
    gpu_type: Literal["H100", "H200", "H20", "B200", "B300", "GB200", "GB300", "CPU"] = Field(
        "B300", description="GPU type of the node pool (trial pods select every nvidia.com/gpu.product string known for it)."
    )
    gpu_budget: int = Field(ge=1, le=4096, description="Most GPUs one configuration (and all running trials together) may use.")
    gpus_per_node: int = Field(8, ge=1, le=72, description="GPUs per node in the pool.")
    node_selector: Optional[dict[str, str]] = Field(
        None,
        description="Node-pool selector of trial pods (e.g. a cloud's node-pool label); default: the operator's "
        "gpuPool.nodeSelector.",
    )
    gpu_product_affinity: bool = Field(
        True,
        description="Also require nvidia.com/gpu.product to be one of gpuType's known GPU Feature Discovery product "
        "strings. Set false on clusters whose GPU nodes carry no GFD labels (the nodeSelector then picks the pool).",
    )
    tolerations: Optional[list[dict[str, Any]]] = Field(
        None, description="Extra tolerations for trial pods (added to the operator's gpuPool.tolerations)."
    )
    pod_template: Optional[dict[str, Any]] = Field(
        None,
        description="PodSpec fields merged into every trial pod like a strategic merge patch (containers, env, "
        "volumes, volumeMounts merged by name/mountPath; e.g. volumes, priorityClassName). Bounded by the operator's "
        "podSecurity settings.",
    )


# --------------------------------------------------------------------------- knobs


class TrainerKnobs(CamelModel):
    tp: int = Field(1, ge=1, le=64, description="Trainer tensor parallel size.")
    pp: int = Field(1, ge=1, le=64, description="Trainer pipeline parallel size.")
    cp: int = Field(1, ge=1, le=64, description="Trainer context parallel size.")
    ep: int = Field(1, ge=1, le=256, description="Trainer expert parallel size (MoE only).")
    micro_batch_tokens: int = Field(
        16384, ge=256, le=1048576, description="Token budget of one training micro-batch per GPU (dynamic batch size)."
    )
    recompute: Literal["none", "selective", "full"] = Field(
        "selective", description="Activation recomputation: trades compute for activation memory."
    )
    offload: bool = Field(False, description="Offload optimizer state and parameters to host memory.")


class RolloutKnobs(CamelModel):
    tp: int = Field(1, ge=1, le=64, description="Rollout (vLLM) tensor parallel size of one engine replica.")
    expert_parallel: bool = Field(False, description="Shard MoE experts across the replica's GPUs (vLLM expert parallel).")
    gpu_memory_utilization: float = Field(
        0.5, ge=0.05, le=0.98, description="Fraction of GPU memory vLLM may use (weights + KV cache)."
    )
    max_num_seqs: int = Field(256, ge=1, le=8192, description="Most sequences one engine decodes at once.")
    max_num_batched_tokens: int = Field(
        8192, ge=16, le=1048576, description="Token budget of one engine iteration (chunked prefill)."
    )
    cuda_graphs: bool = Field(True, description="Capture CUDA graphs for decode (false = enforce_eager).")
    fp8: bool = Field(False, description="Serve rollouts with FP8 weights (faster, larger log-prob mismatch).")


class AsyncKnobs(CamelModel):
    staleness: int = Field(
        0, ge=0, le=16, description="Policy versions rollouts may lag the trainer (0 = synchronous, on-policy)."
    )
    partial_rollout: bool = Field(
        False, description="Interrupt long generations at weight sync and resume them under the new policy."
    )


class CpuKnobs(CamelModel):
    """Real mode on this machine's CPUs: how the cores are split between rollout and trainer."""

    rollout_threads: Optional[int] = Field(None, ge=1, le=256, description="CPU threads for the vLLM engine.")
    trainer_threads: Optional[int] = Field(None, ge=1, le=256, description="CPU threads for torch training.")


class RLConfig(CamelModel):
    """One configuration of the RL loop's performance knobs (canonical, framework-neutral)."""

    gpus: Optional[int] = Field(None, ge=1, le=4096, description="GPUs this configuration uses; default: the budget.")
    placement: Literal["colocated", "disaggregated"] = Field(
        "colocated", description="colocated: trainer and rollout time-share all GPUs; disaggregated: separate pools."
    )
    trainer_gpus: Optional[int] = Field(
        None, ge=1, le=4096, description="Disaggregated only: GPUs of the trainer pool (the rest serve rollouts)."
    )
    trainer: TrainerKnobs = Field(default_factory=TrainerKnobs, description="Trainer parallelism and memory knobs.")
    rollout: RolloutKnobs = Field(default_factory=RolloutKnobs, description="vLLM rollout engine knobs.")
    async_: AsyncKnobs = Field(default_factory=AsyncKnobs, alias="async", description="Async staleness knobs.")
    weight_sync: Literal["nccl", "checkpoint-engine", "disk"] = Field(
        "nccl", description="How new weights reach the rollout engines after each update."
    )
    cpu: Optional[CpuKnobs] = Field(None, description="Real mode on CPUs only: thread split.")

    def flat(self) -> dict[str, Any]:
        """Knob path (e.g. 'rollout.maxNumSeqs') -> value, for search and display."""
        out: dict[str, Any] = {}

        def walk(prefix: str, d: dict) -> None:
            for k, v in d.items():
                if isinstance(v, dict):
                    walk(f"{prefix}{k}.", v)
                else:
                    out[prefix + k] = v

        walk("", self.model_dump(by_alias=True, mode="json"))
        return out

    def with_knobs(self, changes: dict[str, Any]) -> "RLConfig":
        """A copy with some knob paths changed; unknown paths are an error naming the path."""
        d = self.model_dump(by_alias=True, mode="json")
        for path, value in changes.items():
            node = d
            parts = path.split(".")
            for p in parts[:-1]:
                if not isinstance(node.get(p), dict):
                    if p == "cpu" and node.get(p) is None:
                        node[p] = {}
                    else:
                        raise ValueError(f"unknown knob {path!r}")
                node = node[p]
            if parts[-1] not in node and not (parts[0] in ("cpu",) or parts[-1] in ("gpus", "trainerGpus")):
                raise ValueError(f"unknown knob {path!r}")
            node[parts[-1]] = value
        return RLConfig.model_validate(d)

    def key(self) -> str:
        """A stable identity for de-duplicating configurations."""
        import json

        return json.dumps(self.flat(), sort_keys=True)


def knob_paths() -> list[str]:
    """Every knob path a search space may name (RLConfig's leaves, `cpu.*` included)."""
    paths = [p for p in RLConfig().flat() if p != "cpu"]
    return paths + [f"cpu.{to_camel(f)}" for f in CpuKnobs.model_fields]


# --------------------------------------------------------------------------- tuning


class SearchSpace(CamelModel):
    knobs: Optional[dict[str, list[Any]]] = Field(
        None,
        description="Knob path (e.g. rollout.maxNumSeqs) -> candidate values. Unlisted knobs use the catalog's "
        "default range; an empty list pins the knob to the baseline.",
    )
    frozen: Optional[list[str]] = Field(None, description="Knob paths that must stay at the baseline value.")
    allow_fewer_gpus: bool = Field(False, description="Consider configurations that use fewer GPUs than the budget.")
    min_gpus: Optional[int] = Field(None, ge=1, description="With allowFewerGpus: the fewest GPUs to consider.")

    @model_validator(mode="after")
    def _known_knobs(self) -> "SearchSpace":
        known = set(knob_paths())
        for where, paths in (("knobs", self.knobs or {}), ("frozen", self.frozen or [])):
            unknown = sorted(set(paths) - known)
            if unknown:
                raise ValueError(
                    f"searchSpace.{where} names unknown knob(s) {unknown}: use knob paths such as "
                    f"rollout.maxNumSeqs (all: {', '.join(knob_paths())})"
                )
        return self


class Constraints(CamelModel):
    max_staleness: int = Field(1, ge=0, le=16, description="Trainer-rollout gap limit, in policy versions.")
    max_logprob_mismatch: float = Field(
        0.05, gt=0, le=10, description="Limit on mean |log p_rollout - log p_trainer| per token."
    )
    reward_tolerance: float = Field(
        0.05, ge=0, le=1, description="Largest relative drop of mean reward against the baseline still accepted."
    )
    reward_test_alpha: float = Field(
        0.05, gt=0, lt=1, description="Significance level of the one-sided reward test against the baseline."
    )


class Budget(CamelModel):
    max_trials: int = Field(12, ge=1, le=200, description="Most trials (the baseline not counted).")
    parallel_trials: int = Field(2, ge=1, le=64, description="Trials run at once (GPU budget permitting).")
    steps_per_trial: int = Field(6, ge=2, le=100, description="RL steps each trial runs, warm-up included.")
    warmup_steps: int = Field(1, ge=0, le=50, description="Leading steps excluded from scoring.")
    confirm_steps: int = Field(10, ge=0, le=200, description="Steps of the winner's confirmation run (0 = none).")
    max_failed_trials: int = Field(6, ge=1, le=200, description="Failed trials after which the job fails.")
    trial_timeout_seconds: int = Field(3600, ge=10, description="Wall-clock limit of one trial.")
    schedule_timeout_seconds: int = Field(300, ge=5, description="Time a trial may wait for all its pods to be scheduled.")
    metrics_timeout_seconds: int = Field(120, ge=5, description="Time to wait for a finished trial's metrics.")


class MetricsSource(CamelModel):
    prometheus_url: Optional[str] = Field(None, description="Prometheus HTTP API base URL; default: the operator's setting.")
    pushgateway_url: Optional[str] = Field(None, description="Pushgateway trials push to; default: the operator's setting.")
    names: Optional[dict[str, str]] = Field(None, description="Overrides of rltune metric names (contract name -> actual).")


class RLTuningJobSpec(CamelModel):
    workload: Workload = Field(description="What the trials run: framework, image, model and task.")
    resources: Resources = Field(description="The GPU pool and budget.")
    baseline: RLConfig = Field(default_factory=RLConfig, description="The configuration the user runs today.")
    search_space: SearchSpace = Field(default_factory=SearchSpace, description="Which knobs may move and where.")
    constraints: Constraints = Field(default_factory=Constraints, description="Limits a winner must respect.")
    objective: Literal["stepTime", "gpuSecondsPerStep"] = Field(
        "stepTime", description="What to minimise: seconds per RL step, or GPU-seconds per RL step."
    )
    budget: Budget = Field(default_factory=Budget, description="How much trial work the search may spend.")
    metrics: MetricsSource = Field(default_factory=MetricsSource, description="Where trial metrics are read.")

    @model_validator(mode="after")
    def _cross_field(self) -> "RLTuningJobSpec":
        b = self.budget
        if b.warmup_steps >= b.steps_per_trial:
            raise ValueError("budget.warmupSteps must be fewer than budget.stepsPerTrial")
        if b.parallel_trials > b.max_trials:
            raise ValueError("budget.parallelTrials must not exceed budget.maxTrials")
        g = self.baseline.gpus or self.resources.gpu_budget
        if g > self.resources.gpu_budget:
            raise ValueError(
                f"baseline.gpus ({g}) exceeds resources.gpuBudget ({self.resources.gpu_budget}): "
                "raise the budget or lower baseline.gpus"
            )
        self.workload.model.resolved()  # names the missing field if the architecture is incomplete
        return self


# --------------------------------------------------------------------------- trial contract


class TrialSpec(CamelModel):
    """What one trial process receives (env RLTUNE_TRIAL_SPEC as JSON, or --spec FILE)."""

    mode: Literal["twin", "real"] = "twin"
    namespace: str = "default"
    job: str = "local"
    trial: str = "t0"
    model: ModelSpec
    task: TaskSpec = Field(default_factory=TaskSpec)
    gpu_type: str = "B300"
    gpus_per_node: int = 8
    config: RLConfig = Field(default_factory=RLConfig)
    steps: int = 6
    warmup_steps: int = 1
    seed: int = 0
    scenario: Optional[dict[str, Any]] = None
    pushgateway_url: Optional[str] = None
    metrics_port: Optional[int] = None


def trial_spec_for(job_ns: str, job_name: str, trial: str, spec: RLTuningJobSpec, config: RLConfig,
                   steps: int, warmup: int, seed: int = 0, pushgateway_url: Optional[str] = None) -> TrialSpec:
    """The trial contract for one configuration of a job (used by the operator and the local backend)."""
    return TrialSpec(
        mode="real" if spec.workload.framework == "reference" else "twin",
        namespace=job_ns, job=job_name, trial=trial,
        model=spec.workload.model, task=spec.workload.task,
        gpu_type=spec.resources.gpu_type, gpus_per_node=spec.resources.gpus_per_node,
        config=config, steps=steps, warmup_steps=warmup, seed=seed,
        scenario=spec.workload.scenario, pushgateway_url=pushgateway_url,
    )
