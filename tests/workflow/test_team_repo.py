"""The team workflow end to end: init -> git -> compile -> commit -> edit a spec -> the drift
gate fails until the build is refreshed; the team's own groups are found on the search path;
the CI workflow's steps run for real; examples/team-repo is what `init` writes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import yaml
from helpers.paths import ROOT
from helpers.team_repo import VENV_BIN, set_tp

from lmspec.compiler.cli.init import STARTER_SPEC, scaffold_files
from lmspec.compiler.cli.install_source import given, this_install
from lmspec.compiler.cli.spec_repo import repo_specs

SPEC_ARG = f"specs/{STARTER_SPEC}.yaml"


def test_init_compile_commit_edit_then_drift_gate(team_repo: Path, sh, lmspec, monkeypatch) -> None:
    monkeypatch.chdir(team_repo)
    build = Path("build") / STARTER_SPEC
    assert (build / "REPORT.md").is_file() and (build / "manifest.json").is_file()
    assert lmspec("compile", "--check", "--spec", SPEC_ARG).code == 0
    assert lmspec("hook", "compile-check").code == 0

    tp_before = json.loads((build / "plan.json").read_text())["layout"]["tp"]
    set_tp(team_repo, tp_before * 2)
    stale = lmspec("compile", "--check", "--spec", SPEC_ARG)
    assert stale.code == 1
    assert "plan.json (changed)" in stale.err and "spec.resolved.yaml (changed)" in stale.err
    hook = lmspec("hook", "compile-check")
    assert hook.code == 1 and f"lmspec compile --spec {SPEC_ARG}" in hook.err

    assert lmspec("compile", "--spec", SPEC_ARG).code == 0
    assert json.loads((build / "plan.json").read_text())["layout"]["tp"] == tp_before * 2
    assert lmspec("compile", "--check", "--spec", SPEC_ARG).code == 0
    changed = sh("git", "status", "--porcelain", cwd=team_repo).stdout.split("\n")
    assert any(line.endswith(f"build/{STARTER_SPEC}/plan.json") for line in changed)
    assert sh("git", "commit", "-qam", "tp x2", cwd=team_repo).returncode == 0
    assert sh("git", "status", "--porcelain", cwd=team_repo).stdout == ""


def test_hand_edited_build_is_drift(team_repo: Path, lmspec, monkeypatch) -> None:
    monkeypatch.chdir(team_repo)
    report = Path("build") / STARTER_SPEC / "REPORT.md"
    report.write_text(report.read_text() + "edited by hand\n")
    result = lmspec("hook", "compile-check", SPEC_ARG)  # the drift gate checks every build regardless
    assert result.code == 1 and "REPORT.md (changed)" in result.err


def test_team_groups_extend_builtin_ones_through_the_search_path(team_repo: Path, lmspec, monkeypatch) -> None:
    monkeypatch.chdir(team_repo)
    resolved = yaml.safe_load((Path("build") / STARTER_SPEC / "spec.resolved.yaml").read_text())
    ours = yaml.safe_load(Path("specs/hardware/our_cluster.yaml").read_text())
    builtin = yaml.safe_load((ROOT / "specs/hardware/a100_80g.yaml").read_text())
    assert resolved["hardware"]["name"] == ours["name"] and resolved["hardware"]["nodes"] == ours["nodes"]
    assert resolved["hardware"]["inter_node"]["hca"] == ours["inter_node"]["hca"]
    assert resolved["hardware"]["gpu"] == builtin["gpu"]  # inherited from lmspec's a100_80g
    assert resolved["cluster"]["slurm"]["account"] == "our_team"
    explained = json.loads(lmspec("explain", "--format", "json", "--spec", SPEC_ARG).out)
    assert explained["origins"]["hardware.nodes"].startswith("specs/hardware/our_cluster.yaml:")
    assert explained["origins"]["hardware.gpu.name"].endswith(tuple(f"a100_80g.yaml:{n}" for n in range(1, 30)))
    # The team's group is usable from the command line too, like a built-in one.
    assert lmspec("check", "--spec", SPEC_ARG, "hardware=h100_80g").code == 0


def test_hook_check_picks_specs_for_changed_files(team_repo: Path, lmspec, monkeypatch) -> None:
    monkeypatch.chdir(team_repo)
    _second_job(tp=3)
    only_starter = lmspec("hook", "check", SPEC_ARG)
    assert only_starter.code == 0 and "second_job" not in only_starter.out + only_starter.err
    group_changed = lmspec("hook", "check", "specs/hardware/our_cluster.yaml")  # a group can change any job
    assert group_changed.code == 1 and "specs/second_job.yaml: invalid" in group_changed.err
    assert "parallel.tp=3" in group_changed.err


def _second_job(tp: int = 2) -> Path:
    """A second team job beside the starter (another name; valid at tp 2, invalid at tp 3)."""
    second = Path("specs/second_job.yaml")
    text = Path(SPEC_ARG).read_text().replace(f"name: {STARTER_SPEC}", "name: second_job")
    second.write_text(text.replace("  tp: 2", f"  tp: {tp}"))
    return second


def test_commands_without_spec_act_on_every_team_spec(team_repo: Path, sh, lmspec, monkeypatch) -> None:
    monkeypatch.chdir(team_repo)
    _second_job()  # a new job
    set_tp(team_repo, 4)  # and a change to the committed starter job
    diff = lmspec("diff", "--against", "HEAD", "--stat")
    assert diff.code == 0, diff.err
    assert f"{STARTER_SPEC}@HEAD" in diff.out and "parallel.tp 2→4" in diff.out and "identical" not in diff.out
    assert "specs/second_job.yaml: new since HEAD (compiles to second_job/" in diff.out

    stale = lmspec("compile", "--check")
    assert stale.code == 1
    assert f"build/{STARTER_SPEC} is stale (" in stale.err and "build/second_job is stale (" in stale.err
    assert "build/tiny" not in stale.out + stale.err  # never lmspec's built-in default in a spec repo
    checked = lmspec("check")
    assert checked.code == 0 and checked.out.count(": valid (") == 2

    compiled = lmspec("compile")
    assert compiled.code == 0, compiled.err
    assert f"compiled build/{STARTER_SPEC} (" in compiled.out and "compiled build/second_job (" in compiled.out
    fresh = lmspec("compile", "--check")
    assert fresh.code == 0 and fresh.out.count(": up to date") == 2
    assert sh("git", "add", "-A", cwd=team_repo).returncode == 0
    assert sh("git", "commit", "-qm", "tp 4, second job", cwd=team_repo).returncode == 0

    Path("specs/second_job.yaml").unlink()
    after = lmspec("diff", "--against", "HEAD", "--stat")
    assert after.code == 0 and "specs/second_job.yaml: removed since HEAD" in after.out
    assert f"{STARTER_SPEC}@HEAD and {STARTER_SPEC}@worktree: identical" in after.out


def test_compile_of_every_spec_writes_nothing_when_one_is_invalid(team_repo: Path, lmspec, monkeypatch) -> None:
    monkeypatch.chdir(team_repo)
    _second_job(tp=3)  # 16 GPUs do not divide by tp 3
    set_tp(team_repo, 4)
    manifest = Path("build") / STARTER_SPEC / "manifest.json"
    before = manifest.read_bytes()
    result = lmspec("compile")
    assert result.code == 1
    assert "specs/second_job.yaml: invalid" in result.err and "parallel.tp=3" in result.err
    assert "nothing written (build/ is as it was)" in result.err
    assert manifest.read_bytes() == before and not Path("build/second_job").exists()


def test_compile_of_every_spec_refuses_two_specs_with_one_build(team_repo: Path, lmspec, monkeypatch) -> None:
    monkeypatch.chdir(team_repo)
    Path("specs/copy.yaml").write_text(Path(SPEC_ARG).read_text())  # same name: the same build/ directory
    result = lmspec("compile")
    assert result.code == 1
    assert f"specs/copy.yaml and {SPEC_ARG} both compile to build/{STARTER_SPEC}" in result.err


def test_overrides_without_spec_in_a_spec_repo_ask_which_job(team_repo: Path, lmspec, monkeypatch) -> None:
    monkeypatch.chdir(team_repo)
    for command in ("check", "compile", "diff"):
        argv = [command, "--against", "HEAD"] if command == "diff" else [command]
        result = lmspec(*argv, "parallel.tp=4")
        assert result.code == 2, (command, result.err)
        assert f"lmspec {command} --spec specs/" in result.err and "parallel.tp=4" in result.err


def test_lmspec_own_checkout_keeps_the_builtin_default(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # its specs/ are the built-in groups, not a team's jobs
    assert repo_specs(None, ["model=tiny"], "compile") == []


def test_ci_installs_this_lmspec_and_the_readme_says_so(team_repo: Path) -> None:
    workflow = yaml.safe_load((team_repo / ".github/workflows/lmspec.yml").read_text())
    installs = [s["run"] for s in workflow["jobs"]["compile-check"]["steps"] if "pip install" in s.get("run", "")]
    install = this_install()
    assert installs == [f"pip install {shlex.quote(install.requirement)}"]
    readme = (team_repo / "README.md").read_text()
    assert installs[0] in readme and install.origin in readme
    assert ("a CI runner cannot" in readme) is (not install.reachable)


def test_init_refuses_to_overwrite(team_repo: Path, lmspec) -> None:
    result = lmspec("init", str(team_repo))
    assert result.code == 2 and "would overwrite" in result.err


def test_example_team_repo_is_what_init_writes() -> None:
    example = ROOT / "examples" / "team-repo"
    on_disk = {p.relative_to(example).as_posix(): p.read_text() for p in example.rglob("*") if p.is_file()}
    expected = {k: v for k, v in scaffold_files(given("lmspec==0.1.0")).items() if not k.startswith("schemas/")}
    assert on_disk == expected, "examples/team-repo is stale: see examples/README.md to refresh it"


def _run_steps(workflow: dict) -> list[dict]:
    return [s for s in workflow["jobs"]["compile-check"]["steps"] if "run" in s and "pip install" not in s["run"]]


def test_ci_workflow_is_valid_and_its_steps_pass_then_catch_drift(team_repo: Path, sh) -> None:
    path = team_repo / ".github" / "workflows" / "lmspec.yml"
    check = sh(VENV_BIN / "check-jsonschema", "--builtin-schema", "vendor.github-workflows", path, cwd=team_repo)
    assert check.returncode == 0, check.stdout + check.stderr
    steps = _run_steps(yaml.safe_load(path.read_text()))
    assert [s["name"] for s in steps][:2] == [
        "Specs are valid",
        "build/ is up to date (drift gate: lmspec compile --check of every spec)",
    ]
    assert sh("git", "update-ref", "refs/remotes/origin/main", "HEAD", cwd=team_repo).returncode == 0
    set_tp(team_repo, 4)  # a pull request that changed the spec but forgot to recompile
    summary = team_repo.parent / "summary.md"
    env_prefix = f"export GITHUB_BASE_REF=main GITHUB_STEP_SUMMARY={summary}; "
    results = [sh("bash", "-e", "-c", env_prefix + step["run"], cwd=team_repo) for step in steps]
    assert results[0].returncode == 0, results[0].stderr
    assert results[1].returncode == 1 and "is stale" in results[1].stderr
    assert "parallel.tp 2→4" in summary.read_text()
    assert sh(VENV_BIN / "lmspec", "compile", "--spec", SPEC_ARG, cwd=team_repo).returncode == 0
    assert sh("bash", "-e", "-c", env_prefix + steps[1]["run"], cwd=team_repo).returncode == 0


def test_ci_uploads_every_report(team_repo: Path) -> None:
    workflow = yaml.safe_load((team_repo / ".github/workflows/lmspec.yml").read_text())
    upload = next(
        s for s in workflow["jobs"]["compile-check"]["steps"] if s.get("uses", "").startswith("actions/upload-artifact")
    )
    pattern = upload["with"]["path"]
    assert upload["if"] == "always()" and sorted(team_repo.glob(pattern)) == [
        team_repo / "build" / STARTER_SPEC / "REPORT.md"
    ]


def test_builds_do_not_depend_on_where_lmspec_is_installed(team_repo: Path, lmspec, monkeypatch) -> None:
    monkeypatch.chdir(team_repo)
    spec = Path(SPEC_ARG)
    spec.write_text(spec.read_text().replace("  sequence_parallel: true\n", ""))  # warns, quoting parallel/default.yaml
    result = lmspec("compile", "--spec", SPEC_ARG)
    assert result.code == 0 and "parallel.sequence_parallel=false" in result.err
    build = Path("build") / STARTER_SPEC
    leaked = [p.name for p in build.rglob("*") if p.is_file() and str(ROOT) in p.read_text()]
    assert leaked == []
