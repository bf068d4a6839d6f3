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

import re
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.alias_generators import to_camel

from .knob_fields import DeclaredKnob, KnobRole, declared_knobs
from .layout import Layout, layout
from .metrics import STEP_METRICS, TRIAL_METRICS
from .presets import PRESETS

# --------------------------------------------------------------------------- bounds
# Every free string and list of the spec is bounded, so an oversized spec is refused by the API
# server's schema (naming the field) before it reaches etcd or a pod. Where Kubernetes has its own
# limit the bound is Kubernetes' (sources below), elsewhere a generous sane bound.
IMAGE_MAX = 1024  # registry host (<= 253) + repository (< 256) + tag (<= 128) + digest (71) fit
ARG_MAX = 8192  # one command or args item
# verl's and OpenRLHF's own launch scripts run 74-117 items with their Hydra overrides or flags in
# the command (tests/fixtures/launch_scripts): room for several times that
COMMAND_MAX_ITEMS = 1024
ARGS_MAX_ITEMS = 1024
ENV_MAX_ITEMS = 128
ENV_NAME_MAX = 256
ENV_VALUE_MAX = 32768
# Kubernetes >= 1.34: an env var name is any printable ASCII except '=' (KEP-4369,
# https://www.kubernetes.dev/resources/keps/4369/).
ENV_NAME_PATTERN = r"^[ -<>-~]+$"
# Label keys and values (https://kubernetes.io/docs/concepts/overview/working-with-objects/labels/
# #syntax-and-character-set): [DNS-subdomain prefix (<= 253) "/"] name (<= 63); value <= 63.
LABEL_PREFIX_MAX = 253
LABEL_KEY_MAX = LABEL_PREFIX_MAX + 1 + 63
LABEL_VALUE_MAX = 63
LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]$"
)
# a Kueue LocalQueue / WorkloadPriorityClass name that is also a label value (DNS-1123, <= 63)
QUEUE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
NODE_SELECTOR_MAX = 64
TOLERATIONS_MAX = 64
# Toleration fields and enums (https://kubernetes.io/docs/reference/kubernetes-api/workload-resources/
# pod-v1/#scheduling): the API server refuses anything else when the trial pod is created.
TOLERATION_KEYS = ("key", "operator", "value", "effect", "tolerationSeconds")
TOLERATION_OPERATORS = ("Exists", "Equal")
TOLERATION_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
POD_TEMPLATE_MAX_FIELDS = 64  # a PodSpec has fewer top-level fields
SCENARIO_MAX_KEYS = 128
KNOB_VALUES_MAX = 64
URL_MAX = 2048
# A job-named endpoint: a scheme, a host and an optional port, nothing else (no user info, path,
# query or fragment: `http://169.254.169.254/latest/meta-data/...#` would otherwise send the query
# to a metadata path). The same regex is the CRD's CEL rule; which hosts a job may name at all is
# the cluster admin's allow-list (controller/endpoints.py).
URL_PATTERN = r"^https?://([A-Za-z0-9]([-A-Za-z0-9.]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])(:[0-9]{1,5})?/?$"
URL_SHAPE = "must be http:// or https:// and a host with an optional port, nothing after it (e.g. http://prometheus.monitoring:9090)"
METRIC_CONTRACTS = tuple(STEP_METRICS) + tuple(TRIAL_METRICS)
METRIC_NAME_MAX = 256
# Prometheus' metric-name grammar (https://prometheus.io/docs/concepts/data_model/): a name can only
# ever select a series, never change the shape of a query.
METRIC_NAME_PATTERN = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$"
METRIC_NAME_RULE = "is not a Prometheus metric name: letters, digits, '_' and ':', not starting with a digit"

Arg = Annotated[str, StringConstraints(max_length=ARG_MAX)]
LabelValue = Annotated[str, Field(max_length=LABEL_VALUE_MAX)]  # + LABEL_VALUE_PATTERN (validator, CEL)
MetricName = Annotated[str, StringConstraints(min_length=1, max_length=METRIC_NAME_MAX)]  # + METRIC_NAME_PATTERN
KnobValues = Annotated[list[Any], Field(max_length=KNOB_VALUES_MAX)]


def label_key_problem(key: str) -> Optional[str]:
    """Why `key` is not a valid Kubernetes label key (None if it is)."""
    if (
        len(key) > LABEL_KEY_MAX
        or not re.fullmatch(LABEL_KEY_PATTERN, key)
        or ("/" in key and key.index("/") > LABEL_PREFIX_MAX)
    ):
        return (
            f"{key[:80]!r} is not a label key: [a DNS-subdomain prefix of at most {LABEL_PREFIX_MAX} "
            "characters and '/'] then a name of at most 63 alphanumerics, '-', '_' or '.', beginning and "
            "ending alphanumeric (e.g. cloud.google.com/gke-nodepool)"
        )
    return None


def url_problem(url: str) -> Optional[str]:
    """Why `url` is not an http(s) base URL (None if it is)."""
    if not re.match(URL_PATTERN, url):
        return f"{url[:80]!r} {URL_SHAPE}"
    return None


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

    preset: Optional[str] = Field(None, max_length=64, description=f"Architecture preset; one of {sorted(PRESETS)}.")
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
                f"spec.workload.model.preset {self.preset!r} is unknown: use one of {sorted(PRESETS)} "
                "or give the architecture fields"
            )
        for problem in architecture_problems(self.merged()):
            raise ValueError(problem)
        return self

    def merged(self) -> dict:
        """The preset's fields overridden by the given ones (camelCase; possibly incomplete)."""
        base = dict(PRESETS.get(self.preset or "", {}))
        base.update({k: v for k, v in self.model_dump(by_alias=True, exclude={"preset"}).items() if v is not None})
        return base

    def resolved(self) -> "ModelArch":
        base = self.merged()
        missing = [f for f in ("layers", "hidden", "heads", "vocab") if f not in base]
        if missing:
            raise ValueError(f"workload.model lacks {', '.join(missing)}: give a preset or every architecture field")
        return ModelArch.model_validate(base | {"name": self.preset or "custom"})


def architecture_problems(m: dict) -> list[str]:
    """Contradictions of a (merged, camelCase) architecture; the CRD's CEL rules on workload.model say
    the same, for a preset overridden field by field too."""
    heads = m.get("heads") or 1
    kv = m.get("kvHeads") or heads
    layers, dense = m.get("layers") or 1, m.get("denseLayers") or 0
    experts, active = m.get("experts") or 0, m.get("activeExperts") or 0
    out = []
    if kv > heads or heads % kv:
        out.append(
            f"spec.workload.model.kvHeads ({kv}) must not exceed spec.workload.model.heads ({heads}) and must "
            "divide it (each KV head serves heads/kvHeads query heads): fix kvHeads or heads"
        )
    if dense > layers or (experts > 0 and dense >= layers):
        out.append(
            f"spec.workload.model.denseLayers ({dense}) must be fewer than spec.workload.model.layers "
            f"({layers}) (an MoE model needs at least one MoE layer): lower denseLayers"
        )
    if active > experts:
        out.append(
            f"spec.workload.model.activeExperts ({active}) must not exceed spec.workload.model.experts "
            f"({experts}): lower activeExperts (top-k), or set it to 0 for a dense model"
        )
    if experts > 0 and (active < 1 or not m.get("expertFfn")):
        out.append(
            "an MoE model (spec.workload.model.experts > 0) needs spec.workload.model.activeExperts >= 1 "
            "and spec.workload.model.expertFfn >= 1: give them, or set experts to 0 for a dense model"
        )
    return out


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
            kv = (
                self.hidden * (self.kv_lora_rank + self.rope_head_dim)
                + self.kv_lora_rank * self.heads * 2 * self.head_dim
            )
        else:
            kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        return q + kv + o

    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    def routed_params(self) -> float:
        """Parameters of the routed experts (sharded by expert parallelism; 0 for a dense model)."""
        return float(self.moe_layers() * self.experts * 3 * self.hidden * self.expert_ffn)

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
    max_response_tokens: int = Field(
        20480, ge=1, description="Maximum response length in tokens (per turn budget summed)."
    )
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

    @model_validator(mode="after")
    def _mean_below_max(self) -> "TaskSpec":
        if self.mean_response_tokens is not None and self.mean_response_tokens > self.max_response_tokens:
            raise ValueError(
                f"spec.workload.task.meanResponseTokens ({self.mean_response_tokens}) must not exceed "
                f"spec.workload.task.maxResponseTokens ({self.max_response_tokens}): "
                "lower the mean or raise the maximum"
            )
        return self


class EnvVar(CamelModel):
    name: str = Field(
        min_length=1,
        max_length=ENV_NAME_MAX,
        description="Environment variable name: printable ASCII characters except '='.",
    )
    value: str = Field("", max_length=ENV_VALUE_MAX, description="Environment variable value.")


class Workload(CamelModel):
    framework: Literal["verl", "openrlhf", "reference", "twin"] = Field(
        "twin",
        description="RL framework the trials run: reference = rltune's own GRPO loop (vLLM + torch), "
        "twin = the digital twin (simulated GPU cluster), verl/openrlhf = the user's framework via adapters.",
    )
    image: str = Field(
        "ghcr.io/rltune/trial:0.1.0",
        min_length=1,
        max_length=IMAGE_MAX,
        description="Container image of the trial workload.",
    )
    command: Optional[list[Arg]] = Field(
        None, max_length=COMMAND_MAX_ITEMS, description="Container command; default: the image's entry point."
    )
    args: Optional[list[Arg]] = Field(
        None, max_length=ARGS_MAX_ITEMS, description="Container args, before the rendered knobs."
    )
    env: Optional[list[EnvVar]] = Field(
        None, max_length=ENV_MAX_ITEMS, description="Extra environment variables for trial pods."
    )
    model: ModelSpec = Field(description="The policy model's architecture.")
    task: TaskSpec = Field(default_factory=TaskSpec, description="The RL task and batch shape (never tuned).")
    scenario: Optional[dict[str, Any]] = Field(
        None,
        max_length=SCENARIO_MAX_KEYS,
        description="Twin only: overrides of the simulated cluster's hidden efficiency factors and noise.",
    )

    @field_validator("env")
    @classmethod
    def _env_names(cls, v: Optional[list[EnvVar]]) -> Optional[list[EnvVar]]:
        for i, e in enumerate(v or []):
            if not re.fullmatch(ENV_NAME_PATTERN, e.name):
                raise ValueError(
                    f"spec.workload.env[{i}].name: {e.name[:80]!r} is not an environment variable name: "
                    "use printable ASCII characters other than '=' (the value goes in value)"
                )
        return v


GpuType = Literal["H100", "H200", "H20", "H800", "B200", "B300", "GB200", "GB300", "CPU"]
POOLS_MAX = 8


def _selector_problems(where: str, v: Optional[dict[str, str]]) -> None:
    for key, value in (v or {}).items():
        why = label_key_problem(key)
        if why:
            raise ValueError(f"{where}: {why}")
        if not re.fullmatch(LABEL_VALUE_PATTERN, value):
            raise ValueError(
                f"{where}[{key!r}]: {value[:80]!r} is not a label value: at most "
                "63 alphanumerics, '-', '_' or '.', beginning and ending alphanumeric"
            )


class GpuPool(CamelModel):
    """Another GPU pool the job could run on, with its price: the tuner forecasts the job there from
    what it measured here and, when the forecast says cheaper, confirms it with one trial there."""

    name: str = Field(max_length=63, pattern=QUEUE_NAME_PATTERN, description="Name of the pool (a DNS label).")
    gpu_type: GpuType = Field(description="GPU type of the pool's nodes.")
    gpus_per_node: int = Field(8, ge=1, le=72, description="GPUs per node in the pool.")
    gpu_budget: Optional[int] = Field(
        None, ge=1, le=4096, description="Most GPUs the job may use in that pool; default resources.gpuBudget."
    )
    price_per_gpu_hour: float = Field(gt=0, le=1e6, description="Price of one GPU-hour there (the job's currency).")
    node_selector: Optional[dict[str, LabelValue]] = Field(
        None,
        max_length=NODE_SELECTOR_MAX,
        description="Node selector of the pool's trial pods (not resources.nodeSelector); default: none, the GPU "
        "product and the operator's gpuPool.nodeSelector choose.",
    )
    queue_name: Optional[str] = Field(
        None,
        max_length=63,
        pattern=QUEUE_NAME_PATTERN,
        description="Kueue LocalQueue of the pool's trial (its ClusterQueue needs a flavor for the pool's nodes); "
        "default resources.queueName.",
    )

    @field_validator("node_selector")
    @classmethod
    def _labels(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        _selector_problems("spec.resources.pools[].nodeSelector", v)
        return v


class Resources(CamelModel):
    gpu_type: GpuType = Field(
        "B300",
        description="GPU type of the node pool (trial pods select every nvidia.com/gpu.product string known for it).",
    )
    gpu_budget: int = Field(
        ge=1, le=4096, description="Most GPUs one configuration (and all running trials together) may use."
    )
    gpus_per_node: int = Field(8, ge=1, le=72, description="GPUs per node in the pool.")
    node_selector: Optional[dict[str, LabelValue]] = Field(
        None,
        max_length=NODE_SELECTOR_MAX,
        description="Node-pool selector of trial pods (e.g. a cloud's node-pool label); default: the operator's "
        "gpuPool.nodeSelector.",
    )
    gpu_product_affinity: bool = Field(
        True,
        description="Also require nvidia.com/gpu.product to be one of gpuType's known GPU Feature Discovery product "
        "strings. Set false on clusters whose GPU nodes carry no GFD labels (the nodeSelector then picks the pool).",
    )
    tolerations: Optional[list[dict[str, Any]]] = Field(
        None,
        max_length=TOLERATIONS_MAX,
        description="Extra tolerations for trial pods (added to the operator's gpuPool.tolerations).",
    )
    pod_template: Optional[dict[str, Any]] = Field(
        None,
        max_length=POD_TEMPLATE_MAX_FIELDS,
        description="PodSpec fields merged into every trial pod like a strategic merge patch (containers, env, "
        "volumes, volumeMounts merged by name/mountPath; e.g. volumes, priorityClassName). Bounded by the operator's "
        "podSecurity settings.",
    )
    queue_name: Optional[str] = Field(
        None,
        max_length=63,
        pattern=QUEUE_NAME_PATTERN,
        description="Kueue LocalQueue (in the job's namespace) that admits every trial as one workload "
        "(all-or-nothing); default: the operator's kueue.defaultQueue. Without Kueue installed the job waits "
        "(QueueAvailable=False).",
    )
    priority_class_name: Optional[str] = Field(
        None,
        max_length=63,
        pattern=QUEUE_NAME_PATTERN,
        description="Kueue WorkloadPriorityClass of the trials (label kueue.x-k8s.io/priority-class); only with "
        "a queue.",
    )
    price_per_gpu_hour: Optional[float] = Field(
        None,
        gt=0,
        le=1e6,
        description="Price of one GPU-hour in this pool (any currency, the same for every pool): needed by "
        "objective costPerStep and by pools.",
    )
    pools: Optional[list[GpuPool]] = Field(
        None,
        max_length=POOLS_MAX,
        description="Other GPU pools the job could move to, with their prices: the tuner forecasts the winner's "
        "cost per step there and confirms a cheaper pool with one trial (status.poolOffer).",
    )

    @field_validator("node_selector")
    @classmethod
    def _label_keys(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        _selector_problems("spec.resources.nodeSelector", v)
        return v

    def pool(self, name: Optional[str]) -> Optional[GpuPool]:
        """The entry of `pools` named `name` (None: no such pool, or no name)."""
        return next((p for p in self.pools or [] if p.name == name), None) if name else None

    @field_validator("tolerations")
    @classmethod
    def _tolerations(cls, v: Optional[list[dict[str, Any]]]) -> Optional[list[dict[str, Any]]]:
        for i, t in enumerate(v or []):
            for problem in toleration_problems(t):
                raise ValueError(f"spec.resources.tolerations[{i}]{problem}")
        return v


def toleration_problems(t: Any) -> list[str]:
    """What the API server would refuse in one toleration, each as '<.field>: what is wrong + the fix'."""
    if not isinstance(t, dict):
        return [": a toleration is a map of key, operator, value, effect and tolerationSeconds"]
    out = []
    unknown = sorted(set(t) - set(TOLERATION_KEYS))
    if unknown:
        out.append(f": unknown field(s) {unknown}: a toleration has only {', '.join(TOLERATION_KEYS)}")
    op, effect = t.get("operator", "Equal"), t.get("effect", "")
    if op not in TOLERATION_OPERATORS:
        out.append(f".operator: {op!r} is not an operator: use Exists or Equal")
    if effect not in TOLERATION_EFFECTS + ("",):
        out.append(f".effect: {effect!r} is not an effect: use {', '.join(TOLERATION_EFFECTS)} (or omit it for all)")
    for f in ("key", "value"):
        if f in t and not isinstance(t[f], str):
            out.append(f".{f}: must be a string")
    if op == "Exists" and t.get("value"):
        out.append(".value: must be empty when operator is Exists")
    if not t.get("key") and op != "Exists":
        out.append(".operator: an empty key needs operator Exists (it then tolerates every taint)")
    secs = t.get("tolerationSeconds")
    if secs is not None and (not isinstance(secs, int) or isinstance(secs, bool)):
        out.append(".tolerationSeconds: must be an integer number of seconds")
    elif secs is not None and effect != "NoExecute":
        out.append(".tolerationSeconds: only applies to effect NoExecute")
    return out


# --------------------------------------------------------------------------- knobs


class TrainerKnobs(CamelModel):
    tp: Annotated[int, KnobRole("trainer", layout=True)] = Field(
        1, ge=1, le=64, description="Trainer tensor parallel size."
    )
    pp: Annotated[int, KnobRole("trainer", layout=True)] = Field(
        1, ge=1, le=64, description="Trainer pipeline parallel size."
    )
    cp: Annotated[int, KnobRole("trainer", layout=True)] = Field(
        1, ge=1, le=64, description="Trainer context parallel size."
    )
    ep: Annotated[int, KnobRole("trainer", layout=True, moe_only=True)] = Field(
        1, ge=1, le=256, description="Trainer expert parallel size (MoE only)."
    )
    etp: Annotated[Optional[int], KnobRole("trainer", layout=True, moe_only=True)] = Field(
        None,
        ge=1,
        le=64,
        description="Trainer expert tensor parallel size (MoE only): how many GPUs split each expert's GEMMs. "
        "Unset = trainer.tp (Megatron's default); 1 keeps an expert whole on one GPU, so ep*etp GPUs per pipeline "
        "stage hold the experts. A value equal to trainer.tp is the default and is stored unset.",
    )
    micro_batch_tokens: Annotated[int, KnobRole("trainer")] = Field(
        16384, ge=256, le=1048576, description="Token budget of one training micro-batch per GPU (dynamic batch size)."
    )
    recompute: Annotated[Literal["none", "selective", "full"], KnobRole("trainer")] = Field(
        "selective", description="Activation recomputation: trades compute for activation memory."
    )
    offload: Annotated[bool, KnobRole("trainer")] = Field(
        False, description="Offload optimizer state and parameters to host memory."
    )

    @staticmethod
    def kept_etp(tp: Optional[int], etp: Optional[int]) -> Optional[int]:
        """One layout, one form: an expert TP equal to the dense TP is Megatron's default (unset).
        The search's identity of a configuration uses it too (tuner.search.canonical)."""
        return None if etp is not None and etp == tp else etp

    @model_validator(mode="after")
    def _etp_default(self) -> "TrainerKnobs":
        self.etp = self.kept_etp(self.tp, self.etp)
        return self

    @property
    def expert_tp(self) -> int:
        """The expert tensor parallel size this layout runs (Megatron: unset follows the dense TP)."""
        return self.etp if self.etp is not None else self.tp


class RolloutKnobs(CamelModel):
    tp: Annotated[int, KnobRole("rollout", layout=True)] = Field(
        1, ge=1, le=64, description="Rollout (vLLM) tensor parallel size of one engine replica."
    )
    expert_parallel: Annotated[bool, KnobRole("rollout", layout=True, moe_only=True)] = Field(
        False, description="Shard MoE experts across the replica's GPUs (vLLM expert parallel)."
    )
    gpu_memory_utilization: Annotated[float, KnobRole("rollout")] = Field(
        0.5, ge=0.05, le=0.98, description="Fraction of GPU memory vLLM may use (weights + KV cache)."
    )
    max_num_seqs: Annotated[int, KnobRole("rollout")] = Field(
        256, ge=1, le=8192, description="Most sequences one engine decodes at once."
    )
    max_num_batched_tokens: Annotated[int, KnobRole("rollout")] = Field(
        8192, ge=16, le=1048576, description="Token budget of one engine iteration (chunked prefill)."
    )
    cuda_graphs: Annotated[bool, KnobRole("rollout")] = Field(
        True, description="Capture CUDA graphs for decode (false = enforce_eager)."
    )
    fp8: Annotated[bool, KnobRole("rollout")] = Field(
        False, description="Serve rollouts with FP8 weights (faster, larger log-prob mismatch)."
    )

    @field_validator("gpu_memory_utilization", mode="before")
    @classmethod
    def _fraction(cls, v: Any) -> Any:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 1:
            raise ValueError(FRACTION_MESSAGE)
        return v


FRACTION_MESSAGE = (
    "rollout.gpuMemoryUtilization is a fraction of GPU memory, e.g. 0.8 for 80%, not a percent: "
    "use a value from 0.05 to 0.98"
)


class AsyncKnobs(CamelModel):
    staleness: Annotated[int, KnobRole("async")] = Field(
        0, ge=0, le=16, description="Policy versions rollouts may lag the trainer (0 = synchronous, on-policy)."
    )
    partial_rollout: Annotated[bool, KnobRole("async")] = Field(
        False, description="Interrupt long generations at weight sync and resume them under the new policy."
    )
    stale_fraction: Annotated[Optional[float], KnobRole("async")] = Field(
        None,
        ge=0,
        le=1,
        description="Fraction of a training batch that may come from older policy versions (verl fully-async's "
        "staleness_threshold); unset = bounded by staleness alone. Only frameworks that express it run it.",
    )


class CpuKnobs(CamelModel):
    """Real mode on this machine's CPUs: how the cores are split between rollout and trainer."""

    rollout_threads: Annotated[Optional[int], KnobRole("cpu")] = Field(
        None, ge=1, le=256, description="CPU threads for the vLLM engine."
    )
    trainer_threads: Annotated[Optional[int], KnobRole("cpu")] = Field(
        None, ge=1, le=256, description="CPU threads for torch training."
    )


class RLConfig(CamelModel):
    """One configuration of the RL loop's performance knobs (canonical, framework-neutral)."""

    gpus: Optional[int] = Field(None, ge=1, le=4096, description="GPUs this configuration uses; default: the budget.")
    placement: Annotated[Literal["colocated", "disaggregated"], KnobRole("placement")] = Field(
        "colocated", description="colocated: trainer and rollout time-share all GPUs; disaggregated: separate pools."
    )
    trainer_gpus: Annotated[Optional[int], KnobRole("placement")] = Field(
        None, ge=1, le=4096, description="Disaggregated only: GPUs of the trainer pool (the rest serve rollouts)."
    )
    trainer: TrainerKnobs = Field(default_factory=TrainerKnobs, description="Trainer parallelism and memory knobs.")
    rollout: RolloutKnobs = Field(default_factory=RolloutKnobs, description="vLLM rollout engine knobs.")
    async_: AsyncKnobs = Field(default_factory=AsyncKnobs, alias="async", description="Async staleness knobs.")
    weight_sync: Annotated[Literal["nccl", "checkpoint-engine", "disk"], KnobRole("sync")] = Field(
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


def declared() -> dict[str, DeclaredKnob]:
    """Every knob RLConfig declares (a field with a KnobRole), by path: what the tuner's catalog reads."""
    return declared_knobs(RLConfig)


def knob_paths() -> list[str]:
    """Every knob path a search space may name (RLConfig's leaves, `cpu.*` included)."""
    paths = [p for p in RLConfig().flat() if p != "cpu"]
    return paths + [f"cpu.{to_camel(f)}" for f in CpuKnobs.model_fields]


# --------------------------------------------------------------------------- tuning


class SearchSpace(CamelModel):
    knobs: Optional[dict[str, KnobValues]] = Field(
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
    reward_gate: Literal["screen", "nonInferiority"] = Field(
        "nonInferiority",
        description="nonInferiority (default): the winner's confirmation must show its reward drop within "
        "rewardTolerance (the baseline is profiled for max(stepsPerTrial, confirmSteps) steps; condition "
        "RewardGatePowered says whether confirmSteps resolve the tolerance). screen: every trial, the "
        "confirmation included, is rejected only when its reward is shown more than rewardTolerance below the "
        "baseline's (a shorter baseline; drops of about 2-3x the tolerance are caught).",
    )


class Budget(CamelModel):
    max_trials: int = Field(12, ge=1, le=200, description="Most trials (the baseline not counted).")
    parallel_trials: int = Field(2, ge=1, le=64, description="Trials run at once (GPU budget permitting).")
    steps_per_trial: int = Field(6, ge=2, le=100, description="RL steps each trial runs, warm-up included.")
    warmup_steps: int = Field(1, ge=0, le=50, description="Leading steps excluded from scoring.")
    confirm_steps: int = Field(
        12,
        ge=0,
        le=200,
        description="Steps of the winner's confirmation run, warm-up included (0 = none). With "
        "constraints.rewardGate nonInferiority the baseline is profiled as long, and a winner already shown "
        "within rewardTolerance half-way (at rewardTestAlpha/2) is confirmed there and stops.",
    )
    max_failed_trials: int = Field(6, ge=1, le=200, description="Failed trials after which the job fails.")
    planned_steps: int = Field(
        500,
        ge=1,
        le=100_000_000,
        description="Steps of the production run the tuning is weighed against: the search stops once no "
        "trial's expected saving over these steps pays for the trial itself.",
    )
    trial_timeout_seconds: int = Field(3600, ge=10, description="Wall-clock limit of one trial.")
    schedule_timeout_seconds: int = Field(
        300, ge=5, description="Time a trial may wait for all its pods to be scheduled."
    )
    metrics_timeout_seconds: int = Field(120, ge=5, description="Time to wait for a finished trial's metrics.")


class MetricsSource(CamelModel):
    prometheus_url: Optional[str] = Field(
        None, max_length=URL_MAX, description="Prometheus HTTP API base URL; default: the operator's setting."
    )
    pushgateway_url: Optional[str] = Field(
        None, max_length=URL_MAX, description="Pushgateway trials push to; default: the operator's setting."
    )
    names: Optional[dict[str, MetricName]] = Field(
        None,
        max_length=len(METRIC_CONTRACTS),
        description="Overrides of rltune metric names (contract name, e.g. step_duration_seconds -> actual name).",
    )

    @field_validator("prometheus_url", "pushgateway_url")
    @classmethod
    def _http(cls, v: Optional[str], info) -> Optional[str]:
        why = None if v is None else url_problem(v)
        if why:
            raise ValueError(f"spec.metrics.{to_camel(info.field_name)}: {why}")
        return v

    @field_validator("names")
    @classmethod
    def _contracts(cls, v: Optional[dict[str, str]]) -> Optional[dict[str, str]]:
        unknown = sorted(set(v or {}) - set(METRIC_CONTRACTS))
        if unknown:
            raise ValueError(
                f"spec.metrics.names: unknown contract name(s) {unknown}: use {', '.join(METRIC_CONTRACTS)}"
            )
        for k, n in (v or {}).items():
            if not re.match(METRIC_NAME_PATTERN, n):
                raise ValueError(f"spec.metrics.names.{k}: {n[:80]!r} {METRIC_NAME_RULE}")
        return v


class RLTuningJobSpec(CamelModel):
    workload: Workload = Field(description="What the trials run: framework, image, model and task.")
    resources: Resources = Field(description="The GPU pool and budget.")
    baseline: RLConfig = Field(default_factory=RLConfig, description="The configuration the user runs today.")
    search_space: SearchSpace = Field(default_factory=SearchSpace, description="Which knobs may move and where.")
    constraints: Constraints = Field(default_factory=Constraints, description="Limits a winner must respect.")
    objective: Literal["stepTime", "gpuSecondsPerStep", "costPerStep"] = Field(
        "stepTime",
        description="What to minimise: seconds per RL step, GPU-seconds per RL step, or cost per RL step "
        "(resources.pricePerGpuHour x GPUs x seconds; needs the price).",
    )
    budget: Budget = Field(default_factory=Budget, description="How much trial work the search may spend.")
    metrics: MetricsSource = Field(default_factory=MetricsSource, description="Where trial metrics are read.")

    def layout(self, config: Optional[RLConfig] = None) -> Layout:
        """Where `config`'s GPUs go on this job's nodes (default: the baseline): api/layout.py."""
        c = self.baseline if config is None else config
        return layout(c.gpus, c.placement, c.trainer_gpus, self.resources.gpu_budget, self.resources.gpus_per_node)

    @model_validator(mode="after")
    def _cross_field(self) -> "RLTuningJobSpec":
        b = self.budget
        if b.warmup_steps >= b.steps_per_trial:
            raise ValueError("budget.warmupSteps must be fewer than budget.stepsPerTrial")
        if b.parallel_trials > b.max_trials:
            raise ValueError("budget.parallelTrials must not exceed budget.maxTrials")
        if 0 < b.confirm_steps <= b.warmup_steps:
            raise ValueError(
                "budget.confirmSteps must be 0 or more than budget.warmupSteps: the confirmation run would "
                "measure no steady-state step; raise confirmSteps or set it to 0"
            )
        g = self.layout().gpus
        if g > self.resources.gpu_budget:
            raise ValueError(
                f"baseline.gpus ({g}) exceeds resources.gpuBudget ({self.resources.gpu_budget}): "
                "raise the budget or lower baseline.gpus"
            )
        self.workload.model.resolved()  # names the missing field if the architecture is incomplete
        res = self.resources
        if (self.objective == "costPerStep" or res.pools) and res.price_per_gpu_hour is None:
            need = "objective costPerStep" if self.objective == "costPerStep" else "resources.pools"
            raise ValueError(
                f"spec.resources.pricePerGpuHour is required by {need}: set the price of one GPU-hour in this pool"
            )
        names = [p.name for p in res.pools or []]
        if len(set(names)) != len(names):
            raise ValueError(f"spec.resources.pools: names must be unique (got {names})")
        budget = self.resources.gpu_budget
        if self.search_space.min_gpus is not None and self.search_space.min_gpus > budget:
            raise ValueError(
                f"spec.searchSpace.minGpus ({self.search_space.min_gpus}) must not exceed "
                f"spec.resources.gpuBudget ({budget}): lower minGpus or raise the budget"
            )
        for knob, limit, rel in (("gpus", budget, "at most"), ("trainerGpus", budget - 1, "fewer than")):
            over = [
                g
                for g in (self.search_space.knobs or {}).get(knob, [])
                if isinstance(g, int) and not isinstance(g, bool) and g > limit
            ]
            if over:
                raise ValueError(
                    f"spec.searchSpace.knobs.{knob}: {over} must be {rel} spec.resources.gpuBudget ({budget}): "
                    "raise the budget or remove those GPU counts"
                )
        return self


def pool_spec(spec: RLTuningJobSpec, pool: GpuPool) -> RLTuningJobSpec:
    """The job as it would run in `pool`: the same workload, baseline and search, the pool's GPUs, node
    size, budget, node selector and price (the trials there select the pool's GPU product)."""
    res = spec.resources.model_copy(
        update={
            "gpu_type": pool.gpu_type,
            "gpus_per_node": pool.gpus_per_node,
            "gpu_budget": pool.gpu_budget or spec.resources.gpu_budget,
            # the home pool's selector would pin the trial to the home nodes: the pool's own, or none
            # (the GPU product affinity and the operator's gpuPool.nodeSelector then choose)
            "node_selector": pool.node_selector,
            "price_per_gpu_hour": pool.price_per_gpu_hour,
            "queue_name": pool.queue_name or spec.resources.queue_name,
            "pools": None,
        }
    )
    base = spec.baseline
    if base.gpus and base.gpus > res.gpu_budget:
        base = base.model_copy(update={"gpus": None})
    return spec.model_copy(update={"resources": res, "baseline": base})


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


def trial_spec_for(
    job_ns: str,
    job_name: str,
    trial: str,
    spec: RLTuningJobSpec,
    config: RLConfig,
    steps: int,
    warmup: int,
    seed: int = 0,
    pushgateway_url: Optional[str] = None,
) -> TrialSpec:
    """The trial contract for one configuration of a job (used by the operator and the local backend)."""
    return TrialSpec(
        mode="real" if spec.workload.framework == "reference" else "twin",
        namespace=job_ns,
        job=job_name,
        trial=trial,
        model=spec.workload.model,
        task=spec.workload.task,
        gpu_type=spec.resources.gpu_type,
        gpus_per_node=spec.resources.gpus_per_node,
        config=config,
        steps=steps,
        warmup_steps=warmup,
        seed=seed,
        scenario=spec.workload.scenario,
        pushgateway_url=pushgateway_url,
    )
