"""The traps of a first week with lmspec (issue 46, item 4), each tried as a new user meets it: a
`specs/` folder that is no spec repository, an imported model chosen by name, data this machine does not
hold, a pyxis container, the imported file's schema reference and the hint of what comes next, the
released configs `import-model` met, and two values that did not survive a round trip."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from helpers.cli import CliResult
from helpers.paths import ROOT

from lmspec.compiler.cli.spec_repo import REPOSITORY_MARK
from lmspec.compiler.spec.schema import SCHEMA_ID

Lmspec = Callable[..., CliResult]
FIRST_WEEK = ROOT / "tests" / "data" / "hf_configs_first_week"
QWEN3_8B = ROOT / "tests" / "data" / "hf_configs" / "Qwen3-8B.json"
# A small Qwen3 (the shape docs/own-model.md trains) that the default spec's CPU ranks hold.
SMALL_QWEN3 = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}


def _small_qwen3(tmp_path: Path) -> Path:
    path = tmp_path / "released" / "config.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**json.loads(QWEN3_8B.read_text()), **SMALL_QWEN3}), encoding="utf-8")
    return path


def _jobs(root: Path, *names: str, marked: bool) -> None:
    """specs/NAME.yaml jobs (the default spec under another name); `marked`: with the schemas/ `lmspec init`
    writes beside specs/, whose spec-file schema marks a spec repository."""
    (root / "specs").mkdir(exist_ok=True)
    for name in names:
        (root / "specs" / f"{name}.yaml").write_text(f"name: {name}\n", encoding="utf-8")
    if marked:
        shutil.copytree(ROOT / "schemas", root / REPOSITORY_MARK.parent)


# -- 1. repository mode -------------------------------------------------------------------------------------


def test_a_specs_folder_that_is_no_spec_repository_keeps_the_default_spec(
    tmp_path: Path, lmspec: Lmspec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _jobs(tmp_path, "alpha", "zulu", marked=False)  # another tool's specs/, or a folder of one's own files
    checked = lmspec("check", "train.steps=3")
    assert checked.code == 0, checked.err
    assert checked.out.startswith("tiny: valid")
    assert lmspec("compile", "-o", "build").code == 0 and (tmp_path / "build" / "tiny").is_dir()


def test_a_spec_repository_refusing_overrides_lists_its_jobs_and_how_to_pick_one(
    tmp_path: Path, lmspec: Lmspec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _jobs(tmp_path, "alpha", "zulu", marked=True)
    result = lmspec("check", "train.steps=3")
    result.assert_reports(2, ["specs/alpha.yaml, specs/zulu.yaml", "lmspec check --spec specs/JOB.yaml train.steps=3"])
    assert "spec repository" in result.err and str(REPOSITORY_MARK) in result.err
    assert "--spec specs/alpha.yaml" not in result.err  # no job picked for the user
    every = lmspec("check")
    assert every.code == 0 and "specs/alpha.yaml: valid" in every.out and "specs/zulu.yaml: valid" in every.out


# -- 2. an imported model chosen by name --------------------------------------------------------------------


def test_an_imported_model_is_chosen_by_name_where_its_specs_folder_is(
    tmp_path: Path, lmspec: Lmspec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    imported = lmspec("import-model", str(_small_qwen3(tmp_path)), "-o", "specs/model/my_qwen3.yaml")
    assert imported.code == 0, imported.err
    assert "use it: lmspec check model=my_qwen3" in imported.out  # the next step, as typed from here
    checked = lmspec("check", "model=my_qwen3")
    assert checked.code == 0, checked.err
    explained = json.loads(lmspec("explain", "--format", "json", "model=my_qwen3").out)
    assert explained["origins"]["model.qk_norm"].startswith("specs/model/my_qwen3.yaml:")
    assert explained["origins"]["train.steps"].startswith("lmspec:specs/")  # the rest is the built-in default
    # In a spec repository the model goes into a job, named with --spec.
    _jobs(tmp_path, "job", marked=True)
    again = lmspec("import-model", str(_small_qwen3(tmp_path)), "-o", "specs/model/other.yaml")
    assert "lmspec check --spec specs/JOB.yaml model=other" in again.out
    assert lmspec("check", "--spec", "specs/job.yaml", "model=my_qwen3").code == 0


def test_own_groups_are_found_from_a_directory_whose_name_hydra_would_parse(
    tmp_path: Path, lmspec: Lmspec, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search path is a Hydra override: a quote, comma, `=` or backslash in the directory is quoted."""
    odd = tmp_path / "o'b, x=[y]\\'q"
    odd.mkdir()
    monkeypatch.chdir(odd)
    assert lmspec("import-model", str(_small_qwen3(tmp_path)), "-o", "specs/model/mine.yaml").code == 0
    explained = lmspec("explain", "--format", "json", "model=mine")
    assert json.loads(explained.out)["spec"]["model"]["name"] == "mine", explained.err


def test_an_own_model_with_a_builtin_name_is_refused_not_silently_replaced(
    tmp_path: Path, lmspec: Lmspec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert lmspec("import-model", str(_small_qwen3(tmp_path)), "-o", "specs/model/tiny.yaml").code == 0
    lmspec("check", "model=tiny").assert_reports(
        1, ["model=tiny (command-line override): specs/model/tiny.yaml has the name of lmspec's own model", "rename"]
    )


# -- 3. data this machine does not hold ---------------------------------------------------------------------


def test_check_warns_of_a_dataset_and_tokenizer_not_here_naming_the_key_and_run(
    tmp_path: Path, lmspec: Lmspec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = lmspec(
        "check",
        "train.data.tokenizer=hf",
        "train.data.tokenizer_path=tok",
        "train.data.sources=[{path:data/c,weight:1}]",
    )
    assert result.code == 0, result.err  # CI compiles without the data
    assert "2 warnings" in result.out
    tokenizer, source = (line for line in result.err.splitlines() if line.startswith("warning: "))
    assert tokenizer.startswith('warning: train.data.tokenizer_path="tok" (command-line override): not readable here')
    assert source.startswith('warning: train.data.sources.0.path="data/c"') and "data/c.bin and .idx" in source
    assert all("`lmspec run` refuses it" in line for line in (tokenizer, source))
    assert "lmspec data prepare FILE --tokenizer tok --output data/c" in source


# -- 4. a pyxis container -----------------------------------------------------------------------------------

CONTAINER = ["cluster.launcher=slurm", "cluster.slurm.container.image='nvcr.io#nvidia/pytorch:25.01-py3'"]


@pytest.mark.parametrize(
    ("overrides", "fragments"),
    [
        (
            ["cluster.setup=['module load cuda/12.4','export A=1']"],
            ["cluster.setup[0]='module load cuda/12.4'", "runs inside the container", "no `module`", "cluster.env"],
        ),
        (
            ["cluster.slurm.container.workdir=/workspace"],
            ['cluster.slurm.container.workdir="/workspace"', "runs/tiny/", "lost", "workdir=null", ":/workspace']"],
        ),
    ],
    ids=["module-load-inside-the-image", "workdir-on-the-container-fs"],
)
def test_container_traps_are_warnings_naming_the_key_and_the_fix(
    overrides: list[str], fragments: list[str], lmspec: Lmspec
) -> None:
    result = lmspec("check", *CONTAINER, *overrides)
    assert result.code == 0, result.err
    warned = [line for line in result.err.splitlines() if line.startswith("warning: cluster.")]
    assert len(warned) == 1 and all(f in warned[0] for f in fragments), result.err


def test_a_mounted_workdir_and_a_host_setup_without_container_pass_quietly(lmspec: Lmspec) -> None:
    mounted = lmspec(
        "check",
        *CONTAINER,
        "cluster.slurm.container.workdir=/workspace/x",
        "cluster.slurm.container.mounts=['/lustre/me:/workspace']",
    )
    on_host = lmspec("check", "cluster.launcher=slurm", "cluster.setup=['module load cuda/12.4']")
    for result in (mounted, on_host):
        assert result.code == 0 and "0 warnings" in result.out, result.err


def test_the_batch_script_says_what_the_image_must_hold(tmp_path: Path, lmspec: Lmspec) -> None:
    assert lmspec("compile", *CONTAINER, "-o", str(tmp_path)).code == 0
    script = (tmp_path / "tiny" / "launch" / "sbatch.sh").read_text()
    assert "it must hold lmspec and its training stack (torch,\n# megatron-core or DeepSpeed" in script


# -- 5. a portable schema reference, and what comes next ----------------------------------------------------


def test_an_imported_group_names_its_schema_portably(
    tmp_path: Path, lmspec: Lmspec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    source = str(_small_qwen3(tmp_path))
    assert lmspec("import-model", source, "-o", "loose/mine.yaml").code == 0
    _jobs(tmp_path, "job", marked=True)
    assert lmspec("import-model", source, "-o", "specs/model/mine.yaml").code == 0
    modelines = {
        path: next(line for line in Path(path).read_text().splitlines() if "$schema=" in line)
        for path in ("loose/mine.yaml", "specs/model/mine.yaml")
    }
    assert modelines["loose/mine.yaml"].endswith(f"$schema={SCHEMA_ID.replace('spec.schema', 'model.schema')}")
    assert modelines["specs/model/mine.yaml"].endswith("$schema=../../schemas/model.schema.json")
    assert str(ROOT) not in "".join(modelines.values()) and "file://" not in "".join(modelines.values())


def test_compile_says_how_to_run_the_build(tmp_path: Path, lmspec: Lmspec) -> None:
    result = lmspec("compile", "-o", str(tmp_path))
    assert result.code == 0 and f"run it: lmspec run {tmp_path / 'tiny'}" in result.out


def test_data_prepare_says_which_keys_train_on_the_dataset() -> None:
    from lmspec.compiler.cli.data import dataset_overrides

    assert dataset_overrides("data/my corpus", "tok") == (
        "train.data.tokenizer=hf 'train.data.tokenizer_path=\"tok\"' "
        "'train.data.sources=[{path:\"data/my corpus\",weight:1.0}]'"
    )


# -- 6. released configs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("extra", [{}, {"unsloth_fixed": True}], ids=["official", "unsloth-reupload"])
def test_qwen3_coder_imports_with_fields_equal_to_what_lmspec_builds(
    extra: dict[str, object], tmp_path: Path, lmspec: Lmspec
) -> None:
    config = {**json.loads((FIRST_WEEK / "Qwen3-Coder-480B-A35B-Instruct.json").read_text()), **extra}
    source = tmp_path / "config.json"
    source.write_text(json.dumps(config), encoding="utf-8")
    result = lmspec("import-model", str(source), "-o", str(tmp_path / "qwen3_coder.yaml"))
    assert result.code == 0, result.err
    group = yaml.safe_load((tmp_path / "qwen3_coder.yaml").read_text())
    assert (group["qkv_bias"], group["qk_norm"], group["moe"]["num_shared_experts"]) == (False, True, 0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("qkv_bias", True), ("use_qk_norm", False), ("shared_expert_intermediate_size", 2560)],
)
def test_a_field_lmspec_builds_otherwise_is_still_refused(
    field: str, value: object, tmp_path: Path, lmspec: Lmspec
) -> None:
    config = {**json.loads((FIRST_WEEK / "Qwen3-Coder-480B-A35B-Instruct.json").read_text()), field: value}
    source = tmp_path / "config.json"
    source.write_text(json.dumps(config), encoding="utf-8")
    lmspec("import-model", str(source), "-o", str(tmp_path / "x.yaml")).assert_reports(
        2, [f"field {field}: is {value!r}"]
    )
    assert not (tmp_path / "x.yaml").exists()


def test_deepseek_v2_5_group_routing_is_refused_at_import_naming_its_fields(tmp_path: Path, lmspec: Lmspec) -> None:
    output = tmp_path / "deepseek_v2_5.yaml"
    result = lmspec("import-model", str(FIRST_WEEK / "DeepSeek-V2.5.json"), "-o", str(output))
    result.assert_reports(2, ["topk_method='group_limited_greedy'", "topk_group=3", "model.moe.router_group_topk"])
    assert not output.exists()


# -- 7. round trips -----------------------------------------------------------------------------------------


def test_an_escaped_interpolation_survives_a_rebuild_from_the_resolved_spec(tmp_path: Path, lmspec: Lmspec) -> None:
    assert lmspec("compile", r"serve.served_model_name=a\${x}b", "-o", str(tmp_path / "first")).code == 0
    resolved = tmp_path / "first" / "tiny" / "spec.resolved.yaml"
    rebuilt = lmspec("compile", "--spec", str(resolved), "-o", str(tmp_path / "again"))
    assert rebuilt.code == 0, rebuilt.err
    spec = yaml.safe_load((tmp_path / "again" / "tiny" / "spec.resolved.yaml").read_text())
    assert spec["serve"]["served_model_name"] == "a${x}b"


def test_a_served_model_name_reads_back_from_vllm_yaml_as_itself(tmp_path: Path, lmspec: Lmspec) -> None:
    assert lmspec("compile", "serve.served_model_name='tiny-\U0001f600'", "-o", str(tmp_path)).code == 0
    text = (tmp_path / "tiny" / "serve" / "vllm.yaml").read_text(encoding="utf-8")
    assert yaml.safe_load(text)["served-model-name"] == "tiny-\U0001f600"
    assert "\\ud83d" not in text  # not JSON's surrogate pair, which YAML reads as two lone surrogates


@pytest.mark.parametrize("value", ["caf\u00e9", "a\u2028b\x85c", "del\x7f", "\ud83d", 'q"\\', 3, None], ids=repr)
def test_every_vllm_yaml_scalar_is_json_and_reads_back_from_yaml_as_itself(value: object) -> None:
    """Values the label rules refuse today still go through the one dumper: YAML's folded line breaks
    (NEL, LS), DEL and a lone surrogate are escaped, everything else written as itself."""
    from lmspec.compiler.emit.spec_files import dump_json_scalar

    text = dump_json_scalar(value)
    assert json.loads(text) == value and yaml.safe_load(f"k: {text}")["k"] == value
