"""Every value of its kind: a corpus of hostile strings and numbers, one case per input.

Each case is `lmspec check OVERRIDE...`: exit 1, the dotted key and the fix on stderr, no
traceback. Strings are checked by their key's kind (compiler/spec/kinds.py) whole, with ASCII
digits and no control character; numbers are finite, integers are ints (not 2.0, not true),
and every number is bounded before any rule or model runs (so none of these hangs).
"""

from __future__ import annotations

import pytest

NL = "\n"
ESC = "\x1b"
ARABIC_4 = "\u0664"  # ARABIC-INDIC DIGIT FOUR: str.isdigit() and Python's \d say yes
ARABIC_0 = "\u0660"


def _q(value: str) -> str:
    """A Hydra quoted string (the value as written, newline and all)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _string(key: str, value: str, reason: str, case: str) -> object:
    return pytest.param([f"{key}={_q(value)}"], 1, [f"error: {key}=", reason, f"e.g. {key}="], id=f"{key}-{case}")


def _item(key: str, value: str, reason: str, case: str) -> object:
    return pytest.param([f"{key}=[{_q(value)}]"], 1, [f"error: {key}=", "item 0", reason], id=f"{key}-{case}")


NEWLINE_AT_END = "a newline (U+000A) at the end"
CONTROL = "a control character (U+001B) at position"
NON_ASCII_DIGIT = "the non-ASCII digit"
EMPTY = "it is empty"
NOT_FINITE = "NaN and infinities are not accepted"
WHOLE = "write a whole number without a decimal point"
BOOLEAN = "is a boolean, not a number"

STRINGS = [
    # plain names: the build directory, the Slurm job name, preset names
    _string("name", f"tiny{NL}", NEWLINE_AT_END, "newline-at-end"),
    _string("name", f"ti{ESC}ny", CONTROL, "control-in-middle"),
    _string("name", f"tiny{ARABIC_4}", NON_ASCII_DIGIT, "arabic-digit"),
    _string("name", "", EMPTY, "empty"),
    _string("name", "my job", "' ' (U+0020) is not allowed", "space"),
    _string("model.name", f"tiny{NL}", NEWLINE_AT_END, "newline-at-end"),
    _string("model.name", "../../victim", "'/' (U+002F) is not allowed", "path-traversal"),
    _string("hardware.name", f"cpu{ESC}[2J", CONTROL, "control-in-middle"),
    # labels: any printable text, never a control character
    _string("hardware.gpu.name", f"H100{NL}", NEWLINE_AT_END, "newline-at-end"),
    _string("serve.served_model_name", "", EMPTY, "empty"),
    _string("serve.served_model_name", f"tiny{NL}", NEWLINE_AT_END, "newline-at-end"),
    _string("serve.served_model_name", "a\u2028b", "line separator (U+2028)", "line-separator"),
    # host names and IP addresses (serve.sh's endpoint comment, vLLM's --host)
    _string("serve.host", f"127.0.0.1{NL}touch pwned", "a newline (U+000A) at position 9", "newline-injection"),
    _string("serve.host", f"127.0.0.1{NL}", NEWLINE_AT_END, "newline-at-end"),
    _string("serve.host", f"{ARABIC_0}.0.0.0", NON_ASCII_DIGIT, "arabic-digit"),
    _string("serve.host", "", EMPTY, "empty"),
    _string("serve.host", "300.1.2.3", "not a valid IPv4 address", "bad-octet"),
    _string("serve.host", "a;b", "';' (U+003B) is not allowed", "semicolon"),
    # network interface names (NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME)
    _string("hardware.inter_node.socket_ifname", f"eth0{NL}", NEWLINE_AT_END, "newline-at-end"),
    _string("hardware.inter_node.socket_ifname", "$(touch pwned)", "'$' (U+0024) is not allowed", "substitution"),
    _string("hardware.inter_node.socket_ifname", "", EMPTY, "empty"),
    _string("hardware.inter_node.socket_ifname", "a_very_long_interface_name", "does not have the form", "too-long"),
    # RDMA devices (NCCL_IB_HCA items)
    _item("hardware.inter_node.hca", f"mlx5_0{NL}", NEWLINE_AT_END, "newline-at-end"),
    _item("hardware.inter_node.hca", f"mlx5_{ARABIC_0}", NON_ASCII_DIGIT, "arabic-digit"),
    _item("hardware.inter_node.hca", "", EMPTY, "empty"),
    # environment variable names (serve.sh expands ${NAME})
    _string("serve.api_key_env", f"VLLM_API_KEY{NL}", NEWLINE_AT_END, "newline-at-end"),
    _string("serve.api_key_env", "KEY}; touch pwned; #", "'}' (U+007D) is not allowed", "brace-injection"),
    _string("serve.api_key_env", f"KEY_{ARABIC_4}", NON_ASCII_DIGIT, "arabic-digit"),
    _string("serve.api_key_env", "", EMPTY, "empty"),
    # Slurm names (#SBATCH lines, read by sbatch without shell quoting)
    _string("cluster.slurm.partition", f"gpu{NL}#SBATCH --uid=0", "a newline (U+000A) at position 3", "newline-sbatch"),
    _string("cluster.slurm.partition", f"gpu{NL}", NEWLINE_AT_END, "newline-at-end"),
    _string("cluster.slurm.account", f"team{ESC}", "a control character (U+001B) at the end", "control-at-end"),
    _string("cluster.slurm.account", "", EMPTY, "empty"),
    # Slurm times
    _string("cluster.slurm.time", f"{ARABIC_0}{ARABIC_4}:00:00", NON_ASCII_DIGIT, "arabic-digits"),
    _string("cluster.slurm.time", f"04:00:00{NL}", NEWLINE_AT_END, "newline-at-end"),
    _string("cluster.slurm.time", "04:99:00", "does not have the form", "minutes-99"),
    _string("cluster.slurm.time", "", EMPTY, "empty"),
    # paths: any printable text (quoted where placed), never empty, never a control character
    _string("train.checkpoint.dir", "", EMPTY, "empty"),
    _string("train.checkpoint.dir", f"runs/x{NL}", NEWLINE_AT_END, "newline-at-end"),
    _string("train.checkpoint.dir", "runs/x\ty", "a tab (U+0009) at position 6", "tab"),
    _string("convert.output", "", EMPTY, "empty"),
    _string("convert.output", f"runs/hf{NL}rm -rf ~", "a newline (U+000A) at position 7", "newline-injection"),
    _string("serve.model_path", "/models/x\x00y", "a NUL byte (U+0000)", "nul"),
    _string("train.data.tokenizer_path", f"tok{ESC}/bpe", CONTROL, "control-in-middle"),
    _string("train.checkpoint.dir", "runs/" + "x" * 300, "longer than 255 bytes (NAME_MAX)", "component-too-long"),
]


def _number(override: str, key: str, fragments: list[str], case: str) -> object:
    return pytest.param([override], 1, [f"error: {key}=", *fragments], id=f"{key}-{case}")


NUMBERS = [
    # NaN and infinities in float keys (JSON Schema bounds are comparisons: NaN passes them)
    _number("train.optimizer.lr=nan", "train.optimizer.lr", ["NaN", NOT_FINITE, "expected a number"], "nan"),
    _number("train.optimizer.lr=inf", "train.optimizer.lr", ["Infinity", NOT_FINITE], "inf"),
    _number("train.optimizer.min_lr=-inf", "train.optimizer.min_lr", ["-Infinity", NOT_FINITE], "-inf"),
    _number("train.optimizer.beta1=nan", "train.optimizer.beta1", [NOT_FINITE, "<= 1"], "nan"),
    _number("train.optimizer.weight_decay=inf", "train.optimizer.weight_decay", [NOT_FINITE], "inf"),
    _number("train.grad_clip=nan", "train.grad_clip", [NOT_FINITE], "nan"),
    _number("hardware.gpu.memory_gib=inf", "hardware.gpu.memory_gib", [NOT_FINITE], "inf"),
    _number("hardware.gpu.bf16_tflops=nan", "hardware.gpu.bf16_tflops", [NOT_FINITE], "nan"),
    _number("hardware.intra_node.gb_per_s=inf", "hardware.intra_node.gb_per_s", [NOT_FINITE], "inf"),
    _number(
        "hardware.inter_node.gbit_per_s_per_nic=nan", "hardware.inter_node.gbit_per_s_per_nic", [NOT_FINITE], "nan"
    ),
    _number("model.norm_eps=nan", "model.norm_eps", [NOT_FINITE], "nan"),
    _number("model.rope_theta=inf", "model.rope_theta", [NOT_FINITE], "inf"),
    _number("serve.gpu_memory_utilization=nan", "serve.gpu_memory_utilization", [NOT_FINITE, "<= 1"], "nan"),
    _number("serve.cpu_kvcache_space_gib=inf", "serve.cpu_kvcache_space_gib", [NOT_FINITE], "inf"),
    _number("model.num_layers=nan", "model.num_layers", [NOT_FINITE, "expected an integer"], "nan-for-int"),
    # integers written as floats (jsonschema's own checker takes 2.0 as an integer)
    _number("train.checkpoint.keep_last_k=2.0", "train.checkpoint.keep_last_k", [WHOLE, "keep_last_k=2"], "2.0"),
    _number("cluster.master_port=29500.0", "cluster.master_port", [WHOLE, "master_port=29500"], "float"),
    _number("parallel.tp=2.0", "parallel.tp", [WHOLE, "parallel.tp=2"], "2.0"),
    _number("parallel.dp=2.0", "parallel.dp", [WHOLE, "or one of 'auto'"], "2.0-or-auto"),
    _number("parallel.zero_stage=1.0", "parallel.zero_stage", [WHOLE, "one of 0, 1, 2, 3"], "1.0-enum"),
    _number("serve.max_num_batched_tokens=8192.0", "serve.max_num_batched_tokens", [WHOLE, "or null"], "float"),
    _number("train.steps=2.5", "train.steps", ["expected an integer >= 1"], "fraction"),
    _number("parallel.pp_layout=[1.0,1.0]", "parallel.pp_layout.0", ["expected an integer"], "float-items"),
    # booleans for integers
    _number("train.seed=true", "train.seed", [BOOLEAN, "expected an integer >= 0"], "true"),
    _number("hardware.nodes=false", "hardware.nodes", [BOOLEAN], "false"),
    _number("serve.port=true", "serve.port", [BOOLEAN, "<= 65535"], "true"),
    # sane maxima, checked before any rule or model (10^30 layers built a list per layer)
    _number("model.num_layers=1e30", "model.num_layers", ["expected an integer >= 1 <= 1024"], "1e30-float"),
    _number(f"model.num_layers={10**30}", "model.num_layers", ["<= 1024"], "10^30"),
    _number(f"hardware.nodes={10**9}", "hardware.nodes", ["<= 65536"], "10^9"),
    _number(f"model.num_attention_heads={10**12}", "model.num_attention_heads", ["<= 16384"], "10^12"),
    _number(f"model.num_kv_heads={10**12}", "model.num_kv_heads", ["<= 16384"], "10^12"),
    _number(f"train.seed={2**64}", "train.seed", ["<= 4294967295"], "2^64"),
    _number(f"cluster.nccl.timeout_minutes={10**30}", "cluster.nccl.timeout_minutes", ["<= 10080"], "10^30"),
    _number(f"cluster.slurm.cpus_per_task={10**30}", "cluster.slurm.cpus_per_task", ["<= 4096"], "10^30"),
    _number(f"cluster.slurm.signal_seconds={10**30}", "cluster.slurm.signal_seconds", ["<= 31622400"], "10^30"),
    _number(f"hardware.gpus_per_node={10**6}", "hardware.gpus_per_node", ["<= 1024"], "10^6"),
    _number(f"model.hidden_size={10**15}", "model.hidden_size", ["<= 1048576"], "10^15"),
    _number(f"model.vocab_size={10**12}", "model.vocab_size", ["<= 16777216"], "10^12"),
    _number(f"train.global_batch_size={10**20}", "train.global_batch_size", ["<= 16777216"], "10^20"),
    _number(f"train.steps={10**30}", "train.steps", ["<= 1000000000"], "10^30"),
    _number(f"parallel.pp={10**12}", "parallel.pp", ["<= 67108864"], "10^12"),
    _number(f"serve.max_num_seqs={10**12}", "serve.max_num_seqs", ["<= 1048576"], "10^12"),
    _number("train.optimizer.lr=1e30", "train.optimizer.lr", ["<= 100.0"], "1e30"),
    _number("cluster.master_port=65536", "cluster.master_port", ["<= 65535"], "65536"),
    _number(f"parallel.pp_layout=[{10**30}]", "parallel.pp_layout.0", ["<= 1024"], "10^30-item"),
    _number("train.seed=-1", "train.seed", [">= 0"], "negative"),
]

OTHER = [
    # a filled-in mla block with attention=gqa: the rule crashed formatting its own message
    pytest.param(
        [
            "model.attention=gqa",
            "model.mla={q_lora_rank:null,kv_lora_rank:512,qk_nope_head_dim:128,qk_rope_head_dim:64,v_head_dim:128}",
        ],
        1,
        ['error: model.mla={"q_lora_rank": null, "kv_lora_rank": 512', "set model.mla=null or model.attention=mla"],
        id="mla-with-gqa",
    ),
    # a huge but legal count: the hint shows a few divisors, never all of them
    pytest.param(
        ["model.num_attention_heads=10080", "model.num_kv_heads=10080", "parallel.tp=11"],
        1,
        ["error: parallel.tp=11", "valid: 1, 2, 3, 4, 5, 6, ..., 5040, 10080 (72 values)"],
        id="divisor-hint-is-short",
    ),
    pytest.param(
        [f"hardware.nodes={2**16 - 1}", "parallel.tp=2", "parallel.pp=2"],
        1,
        ["error: parallel.dp", "set hardware.nodes=65536"],
        id="next-node-count-computed",
    ),
]

CASES = [*STRINGS, *NUMBERS, *OTHER]


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 55


@pytest.mark.parametrize(("overrides", "code", "fragments"), CASES)
def test_hostile_value_is_refused_with_key_and_fix(
    lmspec, overrides: list[str], code: int, fragments: list[str]
) -> None:
    result = lmspec("check", *overrides)
    result.assert_reports(code, fragments)
    assert "valid (" not in result.out


ACCEPTED = [
    pytest.param(["serve.host=0.0.0.0"], id="host-any-ipv4"),
    pytest.param(["serve.host='::'"], id="host-any-ipv6"),
    pytest.param(["serve.host=node-1.cluster.local"], id="host-fqdn"),
    pytest.param(["serve.host='fe80::1%eth0'"], id="host-ipv6-zone"),
    pytest.param(["hardware.inter_node.socket_ifname='eth0,eth1'"], id="interfaces-list"),
    pytest.param(["hardware.inter_node.hca=['^mlx5_0','=mlx5_1:1']"], id="hca-exclude-exact"),
    pytest.param(["cluster.slurm.time=1-00:00:00"], id="time-with-days"),
    pytest.param(["cluster.slurm.partition='gpu,debug'"], id="partition-list"),
    pytest.param(["train.checkpoint.dir='runs/ünï cødé $HOME'"], id="path-printable-unicode"),
    pytest.param(["serve.served_model_name='org/Model 8B \"chat\"'"], id="label-printable"),
    pytest.param([f"train.seed={2**32 - 1}"], id="seed-at-max"),
    pytest.param(["serve.port=65535"], id="port-at-max"),
    pytest.param(["train.optimizer.lr=1e-3"], id="float-exponent"),
    pytest.param(["hardware.gpu.memory_gib=8"], id="int-for-float"),
]


@pytest.mark.parametrize("overrides", ACCEPTED)
def test_legal_values_of_each_kind_are_accepted(lmspec, overrides: list[str]) -> None:
    result = lmspec("check", *overrides)
    assert result.code == 0, result.err
    assert "valid (" in result.out


@pytest.mark.parametrize(
    ("gpus", "fragment"),
    [
        pytest.param(f"1..{10**12}", "at most 131072 GPUs (65536 nodes", id="range-beyond-the-nodes-maximum"),
        pytest.param(f"{ARABIC_4}", "expected N, LOW..HIGH", id="arabic-digit"),
    ],
)
def test_plan_gpu_counts_are_bounded_and_ascii(lmspec, gpus: str, fragment: str) -> None:
    """`lmspec plan --gpus` took a node range as a list: 10^12 GPUs never returned."""
    lmspec("plan", "--gpus", gpus).assert_reports(2, [f"--gpus {gpus}", fragment])
