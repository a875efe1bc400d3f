"""What a spec value of each kind may hold: one `Kind` per kind of string, one bound per kind of number.

compiler/spec/sections/ declares a kind for every string key and a maximum for every numeric
key (compiler/spec/schema.py refuses to generate a schema otherwise). The JSON Schema carries each
kind as an ECMA `pattern` (editors check it as you type) and as `format: <kind name>`; lmspec's
own check (compiler/spec/schema_check.py) calls `Kind.problem` for that format, so the Python side
never relies on jsonschema's `pattern` (re.search, where `$` matches before a trailing newline
and `\\d` matches Arabic-Indic digits): every string is matched whole (re.fullmatch), with
ASCII classes, after a scan for control characters, and against what a regex cannot say
(an IPv4 address's octets, a path component's length).
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

# Unicode categories no spec string may hold: C0/C1 controls (newline, tab, escape, NUL...),
# format characters (bidi overrides, zero-width joiners), line/paragraph separators, surrogates.
CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs"})
_CONTROL_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab", "\x00": "a NUL byte"}
_CATEGORY_NAMES = {"Cc": "a control character", "Cf": "a format character", "Cs": "a surrogate"}


def control_character(text: str) -> str | None:
    """The first control character of `text`, described (`a newline (U+000A) at the end`), or None."""
    for index, ch in enumerate(text):
        if unicodedata.category(ch) in CONTROL_CATEGORIES:
            category = unicodedata.category(ch)
            name = _CONTROL_NAMES.get(ch) or unicodedata.name(ch, "").lower() or _CATEGORY_NAMES.get(category, category)
            where = "at the end" if index == len(text) - 1 else f"at position {index}"
            return f"{name} (U+{ord(ch):04X}) {where}"
    return None


def _non_ascii_digit(text: str) -> str | None:
    for ch in text:
        if ch.isdigit() and not ch.isascii():
            return f"the non-ASCII digit {ch!r} (U+{ord(ch):04X}); write ASCII digits 0-9"
    return None


@dataclass(frozen=True)
class Kind:
    """One kind of string: its name (the schema's `format`), what it is in words, the whole-string
    pattern (Python and ECMA read it alike), the characters allowed in it, an example and why."""

    name: str
    what: str
    pattern: str  # unanchored; matched whole by re.fullmatch, emitted as ^(?:...)$ for editors
    allowed: str  # a character class: the first character outside it is named in the message
    example: str
    max_length: int
    why: str = ""
    ascii_only: bool = True
    shows_pattern: bool = True  # a pattern that only says "no control characters" is left out of messages
    extra: Callable[[str], str | None] | None = None

    @property
    def anchored(self) -> str:
        """The pattern for JSON Schema: ECMA's ^ and $ (no multiline flag) anchor the whole string."""
        return f"^(?:{self.pattern})$" if "|" in self.pattern else f"^{self.pattern}$"

    def problem(self, value: str) -> str | None:
        """Why `value` is not of this kind (a phrase for the message), or None when it is."""
        if value == "":
            return "it is empty"
        control = control_character(value)
        if control is not None:
            return f"it holds {control}"
        if len(value) > self.max_length:
            return f"it is {len(value)} characters long, at most {self.max_length}"
        if self.ascii_only:
            digit = _non_ascii_digit(value)
            if digit is not None:
                return f"it holds {digit}"
        for ch in value:
            if not re.fullmatch(self.allowed, ch, re.ASCII):
                return f"{ch!r} (U+{ord(ch):04X}) is not allowed"
        if not re.fullmatch(self.pattern, value, re.ASCII):
            return f"it does not have the form of {self.example!r}"
        return self.extra(value) if self.extra is not None else None


_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = rf"{_LABEL}(?:\.{_LABEL})*\.?"
_IPV6 = r"[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(?:%[A-Za-z0-9_.-]+)?"
_IFNAME = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,14}"  # Linux IFNAMSIZ: 15 characters
_SLURM_WORD = r"[A-Za-z0-9][A-Za-z0-9_.-]*"
_PRINTABLE = r"[^\x00-\x1f\x7f]"
NAME_MAX_BYTES = 255  # one path component (Linux NAME_MAX)
PATH_MAX_BYTES = 4095  # a whole path (Linux PATH_MAX, less the NUL)


def _host_problem(value: str) -> str | None:
    try:
        ipaddress.ip_address(value)
        return None
    except ValueError:
        pass
    if ":" in value:
        return "it is not a valid IPv6 address"
    if all(part.isdigit() for part in value.rstrip(".").split(".")):
        return "it is not a valid IPv4 address (four numbers 0-255)"
    if len(value.rstrip(".")) > 253:
        return "a host name has at most 253 characters"
    return None


def _path_problem(value: str) -> str | None:
    if len(value.encode("utf-8")) > PATH_MAX_BYTES:
        return f"it is longer than {PATH_MAX_BYTES} bytes (PATH_MAX)"
    for part in value.split("/"):
        if len(part.encode("utf-8")) > NAME_MAX_BYTES:
            return f"the component {part[:20]!r}... is longer than {NAME_MAX_BYTES} bytes (NAME_MAX)"
    return None


PLAIN_NAME = Kind(
    "plain-name",
    "a plain name (letters, digits, _ . -, starting with a letter or digit)",
    r"[A-Za-z0-9][A-Za-z0-9_.-]*",
    r"[A-Za-z0-9_.-]",
    "llama3_8b",
    NAME_MAX_BYTES,
    why="it names a directory and a Slurm job",
)
LABEL = Kind(
    "label",
    "a label (printable text)",
    rf"{_PRINTABLE}+",
    _PRINTABLE,
    "H100-SXM5-80GB",
    NAME_MAX_BYTES,
    ascii_only=False,
    shows_pattern=False,
)
HOST = Kind(
    "host",
    "a host name or IP address",
    rf"{_HOST_NAME}|{_IPV6}",
    r"[A-Za-z0-9.:%_-]",
    "127.0.0.1",
    253,
    why="vLLM binds to it",
    shows_pattern=False,
    extra=_host_problem,
)
INTERFACE = Kind(
    "interface",
    "a network interface name, or several joined by commas",
    rf"{_IFNAME}(?:,{_IFNAME})*",
    r"[A-Za-z0-9_.,-]",
    "eth0",
    255,
    why="NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME take interface names (at most 15 characters each)",
)
RDMA_DEVICE = Kind(
    "rdma-device",
    "an RDMA device name",
    r"[=^]?[A-Za-z0-9_][A-Za-z0-9_.-]*(?::[0-9]{1,3})?",
    r"[A-Za-z0-9_.:=^-]",
    "mlx5_0:1",
    64,
    why="NCCL_IB_HCA joins them with commas, so each must look like mlx5_0 or mlx5_0:1",
)
ENV_NAME = Kind(
    "env-name",
    "an environment variable name",
    r"[A-Za-z_][A-Za-z0-9_]*",
    r"[A-Za-z0-9_]",
    "VLLM_API_KEY",
    255,
    why="serve.sh reads the variable by this name",
)
SLURM_NAME = Kind(
    "slurm-name",
    "a plain Slurm name (letters, digits, _ . - and , between names)",
    rf"{_SLURM_WORD}(?:,{_SLURM_WORD})*",
    r"[A-Za-z0-9_.,-]",
    "gpu",
    255,
    why="it is written into an #SBATCH line, which sbatch reads without shell quoting",
)
SLURM_TIME = Kind(
    "slurm-time",
    "a Slurm time limit [D-]HH:MM:SS",
    r"(?:[0-9]{1,3}-)?[0-9]{1,2}:[0-5][0-9]:[0-5][0-9]",
    r"[0-9:-]",
    "24:00:00",
    12,
    why="it is sbatch's --time",
)
PATH = Kind(
    "path",
    "a relative or absolute path",
    rf"{_PRINTABLE}+",
    _PRINTABLE,
    "runs/llama3_8b/checkpoints",
    PATH_MAX_BYTES,
    ascii_only=False,
    shows_pattern=False,
    extra=_path_problem,
)

# sbatch reads an #SBATCH line itself: words split at white space, quotes removed, no expansion.
_SBATCH_VALUE = r"[A-Za-z0-9_.,:&|*\[\]()!@%+=/<>^{}?~-]"
SLURM_VALUE = Kind(
    "slurm-value",
    "a Slurm option value (no spaces, quotes, # or backslash)",
    rf"{_SBATCH_VALUE}+",
    _SBATCH_VALUE,
    "a100&ib",
    1024,
    why="it is written into an #SBATCH line, which sbatch splits at spaces and reads quotes in",
)
SLURM_MEM = Kind(
    "slurm-mem",
    "a Slurm memory size (a whole number with an optional K, M, G or T; 0 = all of the node's memory)",
    r"[0-9]+[KMGT]?",
    r"[0-9KMGT]",
    "500G",
    24,
    why="it is sbatch's --mem",
)
SBATCH_OPTION = Kind(
    "sbatch-option",
    "an sbatch option as written after #SBATCH (--name, --name=value or --name value; printable ASCII but #, "
    "which ends what sbatch reads of the line)",
    r'--?[A-Za-z][A-Za-z0-9_-]*(?:[= ][ -!"$-~]*)?',
    r'[ -!"$-~]',
    "--mail-type=END",
    4096,
    why="it is written after #SBATCH on a line of its own, which sbatch reads and bash ignores",
)
SRUN_ARG = Kind(
    "srun-arg",
    "one srun argument (starting with -, printable ASCII)",
    r"-[ -~]*",
    r"[ -~]",
    "--cpu-bind=none",
    4096,
    why="it is one shell word of the srun line that starts the launcher on every node",
)
SHELL_LINE = Kind(
    "shell-line",
    "one line of shell code",
    rf"{_PRINTABLE}+",
    _PRINTABLE,
    "module load cuda/12.4",
    4096,
    ascii_only=False,
    shows_pattern=False,
    why="it runs as written, on every node, before the launcher (launch/setup.sh)",
)
ENV_ASSIGNMENT = Kind(
    "env-assignment",
    "an environment assignment NAME=value",
    rf"[A-Za-z_][A-Za-z0-9_]*={_PRINTABLE}*",
    _PRINTABLE,
    "HF_HOME=/data/hf",
    4096,
    ascii_only=False,
    why="launch/setup.sh exports it on every node, the value quoted as one word",
)
CONTAINER_IMAGE = Kind(
    "container-image",
    "a container image (a registry reference or a squashfs path, no spaces)",
    r"[!-~]+",
    r"[!-~]",
    "nvcr.io#nvidia/pytorch:25.01-py3",
    4096,
    why="it is pyxis' --container-image",
)
CONTAINER_MOUNT = Kind(
    "container-mount",
    "a container mount SRC[:DST[:FLAGS]] (no commas)",
    r"[^\x00-\x1f\x7f,]+",
    r"[^\x00-\x1f\x7f,]",
    "/lustre/data:/data:ro",
    PATH_MAX_BYTES,
    ascii_only=False,
    why="pyxis' --container-mounts joins mounts with commas",
)

# Kubernetes names and values (apimachinery's validation): an object name the pods' DNS names are built from
# (RFC 1123 label), a label key [prefix/]name and its value, a resource quantity, an extended resource name.
_K8S_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_K8S_QUALIFIED = r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_K8S_PREFIX = rf"{_K8S_LABEL}(?:\.{_K8S_LABEL})*"
K8S_NAME = Kind(
    "k8s-name",
    "a Kubernetes name (lowercase letters, digits and -, starting and ending with a letter or digit)",
    _K8S_LABEL,
    r"[a-z0-9-]",
    "llama3-8b",
    63,
    why="it names Kubernetes objects and the DNS names of their pods (RFC 1123 labels)",
)
K8S_LABEL = Kind(
    "k8s-label",
    "a Kubernetes label KEY=VALUE (KEY [prefix/]name, VALUE up to 63 letters, digits, _ . -)",
    rf"(?:{_K8S_PREFIX}/)?{_K8S_QUALIFIED}=(?:{_K8S_QUALIFIED})?",
    r"[A-Za-z0-9_./=-]",
    "nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3",
    253 + 1 + 63 + 1 + 63,
    why="it is a node selector's label, which the API server checks against this syntax",
)
K8S_RESOURCE = Kind(
    "k8s-resource",
    "a Kubernetes extended resource name, [prefix/]name",
    rf"(?:{_K8S_PREFIX}/)?{_K8S_QUALIFIED}",
    r"[A-Za-z0-9_./-]",
    "nvidia.com/gpu",
    253 + 1 + 63,
    why="it is a container's resource limit, named as the device plugin advertises it",
)
K8S_QUANTITY = Kind(
    "k8s-quantity",
    "a Kubernetes quantity (a number with an optional suffix Ki Mi Gi Ti, k M G T or m)",
    r"[0-9]+(?:\.[0-9]+)?(?:Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?",
    r"[0-9.KMGTPEikm]",
    "500Gi",
    64,
    why="it is a container's resource request, which the API server parses as a quantity",
)
K8S_IMAGE = Kind(
    "k8s-image",
    "a container image reference (registry/repository[:tag][@digest], no spaces)",
    r"[A-Za-z0-9][A-Za-z0-9._/:@+-]*",
    r"[A-Za-z0-9._/:@+-]",
    "nvcr.io/nvidia/pytorch:25.01-py3",
    4096,
    why="it is the pods' container image",
)
K8S_KEY = Kind(
    "k8s-key",
    "a Secret's data key (letters, digits, - _ .)",
    r"[-._A-Za-z0-9]+",
    r"[-._A-Za-z0-9]",
    "token",
    253,
    why="it is a secretKeyRef's key",
)

_WEIGHT = r"[0-9]+(?:\.[0-9]+)?"


def _split_problem(value: str) -> str | None:
    if float(value.split(",")[0]) == 0:
        return "its train weight (the first number) is 0: nothing would be trained on"
    return None


SPLIT = Kind(
    "split",
    "three train,valid,test weights (Megatron's --split)",
    rf"{_WEIGHT},{_WEIGHT},{_WEIGHT}",
    r"[0-9.,]",
    "949,50,1",
    64,
    why="it is Megatron's --split: documents are divided between train, valid and test in these proportions",
    extra=_split_problem,
)

_MODULE_NAME = r"[A-Za-z0-9_]+(?:[.][A-Za-z0-9_]+)*"
MODULE_PATTERN_PREFIX = "re:"  # compressed-tensors' mark of a regular expression among module names


def _module_pattern_problem(value: str) -> str | None:
    if not value.startswith(MODULE_PATTERN_PREFIX):
        return None
    try:
        re.compile(value[len(MODULE_PATTERN_PREFIX) :])
    except re.error as exc:
        return f"its regular expression does not compile ({exc})"
    return None


MODULE_PATTERN = Kind(
    "module-pattern",
    "a module name (lm_head, model.layers.0.mlp.gate) or re: and a Python regular expression matched from the "
    "start of the name (re:.*mlp[.]gate$)",
    rf"re:[!-~]+|{_MODULE_NAME}",
    r"[!-~]",
    "re:.*mlp[.]gate$",
    256,
    why="llm-compressor's `ignore` and vLLM's compressed-tensors loader match it against the model's module names",
    extra=_module_pattern_problem,
)

KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        PLAIN_NAME,
        LABEL,
        HOST,
        INTERFACE,
        RDMA_DEVICE,
        ENV_NAME,
        SLURM_NAME,
        SLURM_TIME,
        SLURM_VALUE,
        SLURM_MEM,
        SBATCH_OPTION,
        SRUN_ARG,
        SHELL_LINE,
        ENV_ASSIGNMENT,
        CONTAINER_IMAGE,
        CONTAINER_MOUNT,
        PATH,
        SPLIT,
        MODULE_PATTERN,
        K8S_NAME,
        K8S_LABEL,
        K8S_RESOURCE,
        K8S_QUANTITY,
        K8S_IMAGE,
        K8S_KEY,
    )
}

# Upper bounds of spec numbers: far above any real job, low enough that no rule, model or hint
# does unbounded work on a value the schema accepted (they are checked before any of them runs).
LAYERS_MAX = 1024  # the deepest released models have ~130 layers
WIDTH_MAX = 2**20  # hidden, FFN and head sizes, low-rank projections
HEADS_MAX = 2**14
VOCAB_MAX = 2**24
TOKENS_MAX = 2**24  # sequence and context lengths (16M tokens)
EXPERTS_MAX = 2**14
GPUS_PER_NODE_MAX = 1024
NODES_MAX = 2**16
NVLINK_DOMAIN_MAX = 576  # NVIDIA's largest NVLink domain (NVL576); the racks sold today join 72
RANKS_MAX = GPUS_PER_NODE_MAX * NODES_MAX  # any parallel degree: at most the largest world
NICS_MAX = 64
BATCH_MAX = 2**24  # sequences per micro or global batch
STEPS_MAX = 10**9  # steps, intervals, warm-up
KEEP_MAX = 10_000
SEED_MAX = 2**32 - 1  # torch.manual_seed, random.seed and numpy all take it, with room for per-rank offsets
PORT_MAX = 65535
CPUS_MAX = 4096
SIGNAL_SECONDS_MAX = 366 * 86400
SLURM_MEM_MB_MAX = 2**40  # sbatch --mem in megabytes: an exabyte per node
SITE_LINES_MAX = 256  # setup lines, env assignments, extra sbatch/srun options, container mounts
TIMEOUT_MINUTES_MAX = 7 * 24 * 60
GID_INDEX_MAX = 255
SEQS_MAX = 2**20
BATCHED_TOKENS_MAX = 2**31 - 1
MEMORY_GIB_MAX = 2.0**16
RATE_MAX = 1e6  # TFLOP/s, GB/s, Gbit/s
RATE_MIN = 1e-3  # rates divide: a time per step must stay finite (1e-300 TFLOP/s made it infinite)
LR_MAX = 100.0
WEIGHT_DECAY_MAX = 10.0
GRAD_CLIP_MAX = 1e6
LOSS_WEIGHT_MAX = 100.0  # an auxiliary loss weight; released recipes use <= 1
BLEND_WEIGHT_MAX = 1e6  # blend weights are normalised; only their ratios matter
SOURCES_MAX = 4096  # datasets in one blend (Megatron's --data-path list)
EPS_MAX = 1.0
ROPE_THETA_MAX = 1e12
SCALE_MAX = 1e4  # RoPE scaling factors and coefficients, routed-expert scaling (released: <= 40)
