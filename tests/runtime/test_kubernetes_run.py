"""`lmspec run` on a cluster=kubernetes build: the objects applied with kubectl, the server-side dry run first.

No API server runs here. What is under test is lmspec's run; kubectl, the external tool it drives, is stood in
for by a small script on PATH that records its arguments and answers as kubectl does (its current context,
`serverside-applied` lines, or the API server's refusal on stderr with exit 1).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers.build import compile_build
from helpers.cli import CliResult
from helpers.specs import ON_KUBERNETES

from lmspec.compiler.build.files import K8S_BUILD, K8S_POD_SH, K8S_SERVE, K8S_TRAIN, TORCHRUN_SH

NAMESPACE = "ml-train"
CONTEXT = "kind-lmspec"
SEP = "\x1f"  # between the recorded arguments of one call
REFUSAL = 'Error from server (NotFound): namespaces "ml-train" not found'

STAND_IN = r"""#!/bin/bash
# stands in for kubectl: records its arguments, answers what lmspec asks
{ printf '%s\037' "$@"; printf '\n'; } >> "$KUBECTL_CALLS"
if [[ "$1 $2" == "config current-context" ]]; then
  if [[ -n "${KUBECTL_CONTEXT:-}" ]]; then echo "$KUBECTL_CONTEXT"; exit 0; fi
  echo "error: current-context is not set" >&2; exit 1
fi
if [[ " $* " == *" --dry-run=server "* ]]; then
  if [[ -n "${KUBECTL_REFUSE:-}" ]]; then echo "$KUBECTL_REFUSE" >&2; exit 1; fi
  echo "configmap/tiny-build serverside-applied (server dry run)"; exit 0
fi
if [[ -n "${KUBECTL_CONFLICT:-}" ]]; then echo "$KUBECTL_CONFLICT" >&2; exit 1; fi
echo "configmap/tiny-build serverside-applied"
"""
# every other program `lmspec run` could start for a local launcher: any call of one is recorded as a failure
OTHERS = ("bash", "sh", "torchrun", "python", "python3", "sbatch", "srun")


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    overrides = [
        *ON_KUBERNETES,
        f"cluster.kubernetes.namespace={NAMESPACE}",
    ]
    return compile_build(tmp_path_factory.mktemp("k8s"), overrides).dir.resolve()


@pytest.fixture
def path_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder that is the whole PATH, holding recorders for every program but kubectl, and the working
    directory (runs/ would appear here)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in OTHERS:
        _script(folder / name, f'#!/bin/sh\necho {name} "$@" >> "{tmp_path / "others"}"\n')
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setenv("KUBECTL_CALLS", str(tmp_path / "calls"))
    monkeypatch.delenv("KUBECTL_CONTEXT", raising=False)
    monkeypatch.delenv("KUBECTL_REFUSE", raising=False)
    monkeypatch.delenv("KUBECTL_CONFLICT", raising=False)
    monkeypatch.chdir(tmp_path)
    return folder


@pytest.fixture
def kubectl(path_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The stand-in kubectl on PATH, with a current context."""
    _script(path_dir / "kubectl", STAND_IN)
    monkeypatch.setenv("KUBECTL_CONTEXT", CONTEXT)
    return path_dir / "kubectl"


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _calls(tmp_path: Path) -> list[list[str]]:
    log = tmp_path / "calls"
    if not log.exists():
        return []
    return [line.split(SEP)[:-1] for line in log.read_text().splitlines()]


def _apply(build: Path, job: str, *, dry_run: bool) -> list[str]:
    files = ["-f", str(build / K8S_BUILD), "-f", str(build / job)]
    dry = ["--dry-run=server"] if dry_run else []
    return [
        "kubectl",
        "apply",
        "--server-side",
        "--field-manager=lmspec",
        f"--namespace={NAMESPACE}",
        *dry,
        *files,
    ]


def _nothing_else_ran(tmp_path: Path) -> None:
    assert not (tmp_path / "others").exists(), (tmp_path / "others").read_text()
    assert not (tmp_path / "runs").exists()


def test_without_kubectl_the_commands_are_printed_and_nothing_runs(
    lmspec: Callable[..., CliResult], build: Path, path_dir: Path, tmp_path: Path, runtime_logging: None
) -> None:
    result = lmspec("run", str(build))
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert lines[0].startswith("# kubectl is not on PATH: lmspec applies nothing.")
    commands = [line for line in lines if not line.startswith("#")]
    assert commands[:2] == [
        shlex.join(_apply(build, K8S_TRAIN, dry_run=True)),
        shlex.join(_apply(build, K8S_TRAIN, dry_run=False)),
    ]
    assert f"--namespace={NAMESPACE}" in commands[-2] and commands[-2].startswith("kubectl delete")
    assert any(line.startswith("kubectl logs") for line in commands)
    _nothing_else_ran(tmp_path)


def test_without_a_context_the_commands_are_printed(
    lmspec: Callable[..., CliResult],
    build: Path,
    kubectl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    runtime_logging: None,
) -> None:
    monkeypatch.delenv("KUBECTL_CONTEXT")
    result = lmspec("run", str(build))
    assert result.code == 0, result.err
    assert "current-context is not set" in result.out.splitlines()[0]
    assert shlex.join(_apply(build, K8S_TRAIN, dry_run=False)) in result.out.splitlines()
    assert _calls(tmp_path) == [["config", "current-context"]]  # asked, nothing applied
    _nothing_else_ran(tmp_path)


def test_the_server_dry_run_comes_first_then_the_apply(
    lmspec: Callable[..., CliResult], build: Path, kubectl: Path, tmp_path: Path, runtime_logging: None
) -> None:
    result = lmspec("run", str(build))
    assert result.code == 0, result.err
    assert _calls(tmp_path) == [
        ["config", "current-context"],
        _apply(build, K8S_TRAIN, dry_run=True)[1:],
        _apply(build, K8S_TRAIN, dry_run=False)[1:],
    ]
    assert "configmap/tiny-build serverside-applied" in result.out
    assert f"(kubectl context {CONTEXT})" in result.out
    follow = [line for line in result.out.splitlines() if line.startswith("kubectl ")]
    assert follow and all(f"--namespace={NAMESPACE}" in line for line in follow)
    assert any(line.startswith("kubectl logs") for line in follow)
    _nothing_else_ran(tmp_path)


def test_a_refused_dry_run_applies_nothing(
    lmspec: Callable[..., CliResult],
    build: Path,
    kubectl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    runtime_logging: None,
) -> None:
    monkeypatch.setenv("KUBECTL_REFUSE", REFUSAL)
    result = lmspec("run", str(build))
    assert result.code == 1
    assert REFUSAL in result.err
    assert "nothing was applied" in result.err
    assert _calls(tmp_path) == [["config", "current-context"], _apply(build, K8S_TRAIN, dry_run=True)[1:]]
    _nothing_else_ran(tmp_path)


def test_an_apply_refused_after_its_dry_run_exits_1_with_the_message(
    lmspec: Callable[..., CliResult],
    build: Path,
    kubectl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    runtime_logging: None,
) -> None:
    conflict = 'error: Apply failed with 1 conflict: conflict with "kubectl-client-side-apply" using v1: .data'
    monkeypatch.setenv("KUBECTL_CONFLICT", conflict)
    result = lmspec("run", str(build))
    assert result.code == 1
    assert conflict in result.err and "after its dry run passed" in result.err
    assert len(_calls(tmp_path)) == 3
    assert "kubectl logs" not in result.out  # nothing to follow


def test_a_queued_jobset_on_a_claim_is_followed_through_kueue(
    lmspec: Callable[..., CliResult], tmp_path: Path, path_dir: Path, runtime_logging: None
) -> None:
    overrides = [
        *ON_KUBERNETES,
        "cluster.kubernetes.flavor=jobset",
        "cluster.kubernetes.queue=team-a",
        "cluster.kubernetes.volume_claim=lmspec-scratch",
    ]
    build = compile_build(tmp_path / "queued", overrides).dir.resolve()
    result = lmspec("run", str(build), "--dry-run")
    assert result.code == 0, result.err
    lines = result.out.splitlines()
    assert "kubectl get workloads --namespace=default   # Kueue's LocalQueue team-a admits the job" in "\n".join(lines)
    assert "kubectl get jobset tiny --namespace=default" in lines
    delete = next(line for line in lines if line.startswith(f"kubectl delete --namespace=default -f {build}/k8s/train"))
    assert "the volume claim lmspec-scratch and what is on it stay" in delete


def test_an_edited_build_configmap_is_refused(
    lmspec: Callable[..., CliResult], tmp_path: Path, kubectl: Path, runtime_logging: None
) -> None:
    edited = compile_build(tmp_path / "edited", list(ON_KUBERNETES)).dir
    configmap = edited / K8S_BUILD
    with open(configmap, "a") as text:
        text.write("# edited by hand\n")
    result = lmspec("run", str(edited))
    result.assert_reports(2, [K8S_BUILD, "changed since lmspec compiled it", "lmspec compile"])
    assert _calls(tmp_path) == []  # refused before kubectl is asked anything


def test_an_edited_pod_script_is_refused(
    lmspec: Callable[..., CliResult], tmp_path: Path, kubectl: Path, runtime_logging: None
) -> None:
    """What the ConfigMap carries is checked against manifest.json first: the pods would run it."""
    edited = compile_build(tmp_path / "edited", list(ON_KUBERNETES)).dir
    with open(edited / K8S_POD_SH, "a") as script:
        script.write("echo edited\n")
    result = lmspec("run", str(edited))
    result.assert_reports(2, [K8S_POD_SH, "changed since lmspec compiled it"])
    assert _calls(tmp_path) == []


def test_dry_run_prints_the_commands_and_runs_nothing(
    lmspec: Callable[..., CliResult], build: Path, kubectl: Path, tmp_path: Path, runtime_logging: None
) -> None:
    result = lmspec("run", str(build), "--dry-run")
    assert result.code == 0, result.err
    assert shlex.join(_apply(build, K8S_TRAIN, dry_run=True)) in result.out.splitlines()
    assert shlex.join(_apply(build, K8S_TRAIN, dry_run=False)) in result.out.splitlines()
    assert _calls(tmp_path) == []
    _nothing_else_ran(tmp_path)


def test_serving_applies_the_serve_objects(
    lmspec: Callable[..., CliResult], build: Path, kubectl: Path, tmp_path: Path, runtime_logging: None
) -> None:
    result = lmspec("run", str(build), "--stage", "serve")
    assert result.code == 0, result.err
    assert _calls(tmp_path) == [
        ["config", "current-context"],
        _apply(build, K8S_SERVE, dry_run=True)[1:],
        _apply(build, K8S_SERVE, dry_run=False)[1:],
    ]
    assert any(line.startswith("kubectl port-forward") for line in result.out.splitlines())
    _nothing_else_ran(tmp_path)


def test_smoke_checks_the_scripts_and_the_server_dry_run_and_applies_nothing(
    lmspec: Callable[..., CliResult],
    build: Path,
    kubectl: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    runtime_logging: None,
) -> None:
    monkeypatch.setenv("PATH", f"{kubectl.parent}:/usr/bin:/bin")  # the real bash parses the scripts
    result = lmspec("run", str(build), "--smoke")
    assert result.code == 0, result.err
    assert f"smoke: ok {K8S_POD_SH} parses (bash -n)" in result.out
    assert f"smoke: ok {TORCHRUN_SH} parses (bash -n)" in result.out
    assert _calls(tmp_path) == [["config", "current-context"], _apply(build, K8S_TRAIN, dry_run=True)[1:]]


def test_import_is_refused_with_the_way_to_import(
    lmspec: Callable[..., CliResult], build: Path, kubectl: Path, tmp_path: Path, runtime_logging: None
) -> None:
    """torchrun on this machine is not where a Kubernetes build's ranks run: refused before the HF directory is
    read (it need not be on this machine)."""
    result = lmspec("run", str(build), "--stage", "import", "--from", str(tmp_path / "no-such-model"))
    result.assert_reports(2, ["--stage import", "cluster=local", "train.init_from="])
    assert _calls(tmp_path) == []
    _nothing_else_ran(tmp_path)
