"""The build as a typed contract: plan.json round-trips into the Plan, Build.open hands out the
typed Spec and Plan, and every build file name in the code comes from compiler/build/files.py."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from lmspec.compiler import plan as plan_module
from lmspec.compiler.build import files
from lmspec.compiler.build.reader import Build, DamagedBuild
from lmspec.compiler.build.writer import write_build
from lmspec.compiler.emit.manifest import build_files
from lmspec.compiler.emit.spec_files import emit_plan_json
from lmspec.compiler.paths import SPECS_DIR
from lmspec.compiler.pipeline import plan_from
from lmspec.compiler.plan import Plan
from lmspec.compiler.spec.load import Composed, compose_spec

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted(p for p in SPECS_DIR.glob("*.yaml") if p.name != "config.yaml")
FILES_MODULE = ROOT / "compiler" / "build" / "files.py"
# The backends are also called "deepspeed" and "torchtitan" (train.backend), and "tensorboard" and "wandb" are
# the packages that write those folders: each word is a name of something else too, not only a directory.
SHARED_WORDS = {files.DEEPSPEED_DIR, files.TORCHTITAN_DIR, files.TENSORBOARD_DIR, files.WANDB_DIR}
NAMES = {
    value: name
    for name, value in vars(files).items()
    if name.isupper() and isinstance(value, str) and value not in SHARED_WORDS
}
# Directories a name can sit below; not `runs`: the spec's examples of users' paths start with it.
PARENTS = [value for value in NAMES if "/" not in value and value != files.RUNS]


def _compiled(spec_file: Path) -> tuple[Plan, Composed]:
    composed = compose_spec([], spec_file)
    return plan_from(composed), composed


@pytest.mark.parametrize("spec_file", PRESETS, ids=[p.stem for p in PRESETS])
def test_plan_json_round_trips_into_an_equal_plan(spec_file: Path) -> None:
    plan, composed = _compiled(spec_file)
    document = json.loads(emit_plan_json(plan)[files.PLAN])
    assert Plan.from_json(document, plan.spec, composed, list(plan.warnings)) == plan


@pytest.mark.parametrize("spec_file", PRESETS, ids=[p.stem for p in PRESETS])
def test_build_open_returns_the_compiled_spec_and_plan(
    spec_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    plan, _ = _compiled(spec_file)
    write_build(tmp_path / plan.name, build_files(plan))
    build = Build.open(tmp_path / plan.name)
    assert build.spec == plan.spec
    # The origins are the build's spec file, no longer the preset's lines; the warnings are the rules', which
    # the build contract does not run (compiler/contract.py).
    assert set(build.plan.origins.where.values()) == {f"{plan.name}/{files.SPEC}"}
    assert build.plan.warnings == ()
    assert dataclasses.replace(build.plan, origins=plan.origins, warnings=plan.warnings) == plan


def test_the_plan_carries_where_the_run_writes() -> None:
    plan, _ = _compiled(SPECS_DIR / "tiny_moe_pretrain_2rank_cpu_fp32.yaml")
    assert plan.paths.run_dir == files.run_dir(plan.name) == f"runs/{plan.name}"
    assert plan.served().model_dir == plan.spec.convert.output  # no serve.model_path: the conversion output
    assert plan.device == "cpu"
    gpu, _ = _compiled(SPECS_DIR / "llama3_8b_pretrain_8gpu_h100_bf16.yaml")
    assert gpu.device == "gpu"


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda d: d["layout"].__setitem__("world_size", 4), "layout.world_size"),
        (lambda d: d["memory"]["stages"][0].__setitem__("layers", 99), "memory.stages.0.layers"),
        (lambda d: d.pop("comm"), "comm"),
        (lambda d: d.__setitem__("extra", 1), "extra"),
    ],
    ids=["world-size", "stage-layers", "no-comm", "extra-section"],
)
def test_a_plan_document_that_is_not_the_plans_is_refused_by_entry(change, named: str) -> None:
    plan, composed = _compiled(SPECS_DIR / "tiny_moe_pretrain_2rank_cpu_fp32.yaml")
    document = json.loads(emit_plan_json(plan)[files.PLAN])
    change(document)
    with pytest.raises(ValueError, match=f"its '{named}' is not what lmspec derives from the spec"):
        Plan.from_json(document, plan.spec, composed, list(plan.warnings))


def _forge_plan(root: Path, change: Callable[[dict], object]) -> None:
    """plan.json edited, and manifest.json rewritten to hash it: only the checks beyond hashes can refuse it."""
    doc = json.loads((root / files.PLAN).read_text(encoding="utf-8"))
    change(doc)
    text = json.dumps(doc)
    (root / files.PLAN).write_text(text, encoding="utf-8")
    manifest = json.loads((root / files.MANIFEST).read_text(encoding="utf-8"))
    manifest["files"][files.PLAN] = hashlib.sha256(text.encode()).hexdigest()
    (root / files.MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")


def test_a_rank_runs_no_cost_model_and_never_reads_its_sections(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Build.open, which every rank runs, compares plan.json with the spec's Plan except the cost model's
    sections (memory, comm), and does not run the model: the Plan derives those numbers from the spec when
    they are read, never from the file. The commands that run once (cost_model=True) refuse an edit there."""
    monkeypatch.chdir(tmp_path)
    plan, _ = _compiled(SPECS_DIR / "tiny_moe_pretrain_2rank_cpu_fp32.yaml")
    root = tmp_path / plan.name
    write_build(root, build_files(plan))
    _forge_plan(root, lambda d: d["memory"]["stages"][0].__setitem__("layers", 99))

    def unpriced(*_: object) -> None:
        raise AssertionError("Build.open ran the cost model")

    with monkeypatch.context() as patched:
        patched.setattr(plan_module, "estimate_train_memory", unpriced)
        patched.setattr(plan_module, "estimate_comm_and_step", unpriced)
        build = Build.open(root)
    assert build.plan.trained().memory == plan.trained().memory  # the spec's numbers, not the edited file's
    assert build.plan.trained().comm == plan.trained().comm
    with pytest.raises(DamagedBuild, match="its 'memory.stages.0.layers' is not what lmspec derives from the spec"):
        Build.open(root, cost_model=True)
    _forge_plan(root, lambda d: d.pop("comm"))  # the sections must still be there
    with pytest.raises(DamagedBuild, match="its 'comm' is not what lmspec derives from the spec"):
        Build.open(root)


def _file_names_in(path: Path) -> list[str]:
    """`path:line: 'literal'` for each string constant that is a build or run file name (or a path below one)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value
            if value in NAMES or any(value.startswith(f"{name}/") for name in PARENTS):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {value!r} (files.{NAMES.get(value, '...')})")
    return found


def test_every_build_file_name_in_the_code_comes_from_files_py() -> None:
    sources = sorted(p for pkg in ("compiler", "runtime") for p in (ROOT / pkg).rglob("*.py") if p != FILES_MODULE)
    assert len(sources) > 100
    assert [hit for path in sources for hit in _file_names_in(path)] == []


def test_the_scan_finds_a_literal() -> None:
    """The test above is not blind: files.py itself spells every name."""
    assert len(_file_names_in(FILES_MODULE)) >= len(NAMES)
