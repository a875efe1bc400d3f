"""The requirement `lmspec init` writes into the team's CI, for each way pip records an install
(PEP 610's direct_url.json), with real git checkouts; pip's own parser judges each one."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from helpers.paths import ROOT
from packaging.requirements import Requirement

from lmspec.compiler.cli.install_source import install_source, this_install


def _checkout(path: Path, sh, remote: str | None) -> str:
    """A git checkout with one commit (and `origin` when `remote`); its HEAD commit."""
    path.mkdir(parents=True)
    (path / "pyproject.toml").write_text("[project]\nname = 'lmspec'\n")
    for argv in (("git", "init", "-q"), ("git", "add", "-A"), ("git", "commit", "-qm", "lmspec")):
        assert sh(*argv, cwd=path).returncode == 0
    if remote is not None:
        assert sh("git", "remote", "add", "origin", remote, cwd=path).returncode == 0
    return sh("git", "rev-parse", "HEAD", cwd=path).stdout.strip()


def _pip_url(requirement: str) -> str | None:
    return Requirement(requirement).url  # the parser pip vendors; raises on what pip would refuse


def test_index_install_pins_the_version() -> None:
    source = install_source(None, "0.1.0")
    assert source.requirement == "lmspec==0.1.0" and source.reachable
    assert str(Requirement(source.requirement).specifier) == "==0.1.0"


@pytest.mark.parametrize(
    ("record", "requirement", "reachable"),
    [
        (
            {"url": "https://github.com/org/lmspec.git", "vcs_info": {"vcs": "git", "commit_id": "a" * 40}},
            f"lmspec @ git+https://github.com/org/lmspec.git@{'a' * 40}",
            True,
        ),
        (
            {
                "url": "https://github.com/org/mono.git",
                "subdirectory": "tools/lmspec",
                "vcs_info": {"vcs": "git", "commit_id": "b" * 40, "requested_revision": "v0.1.0"},
            },
            f"lmspec @ git+https://github.com/org/mono.git@{'b' * 40}#subdirectory=tools/lmspec",
            True,
        ),
        (
            {"url": "file:///srv/lmspec", "vcs_info": {"vcs": "git", "commit_id": "c" * 40}},
            f"lmspec @ git+file:///srv/lmspec@{'c' * 40}",
            False,
        ),
        (
            {"url": "https://wheels.example.com/lmspec-0.1.0-py3-none-any.whl", "archive_info": {}},
            "lmspec @ https://wheels.example.com/lmspec-0.1.0-py3-none-any.whl",
            True,
        ),
        (
            {"url": "file:///tmp/dist/lmspec-0.1.0-py3-none-any.whl", "archive_info": {"hashes": {}}},
            "lmspec @ file:///tmp/dist/lmspec-0.1.0-py3-none-any.whl",
            False,
        ),
    ],
    ids=["git-https", "git-subdirectory", "git-local", "wheel-url", "wheel-path"],
)
def test_recorded_vcs_and_archive_installs(record: dict, requirement: str, reachable: bool) -> None:
    source = install_source(record, "0.1.0")
    assert (source.requirement, source.reachable) == (requirement, reachable)
    assert _pip_url(source.requirement) == requirement.split(" @ ", 1)[1]


@pytest.mark.parametrize(
    ("remote", "url", "reachable"),
    [
        ("git@github.com:org/lmspec.git", "git+ssh://git@github.com/org/lmspec.git", True),
        ("https://gitlab.example.com/ml/lmspec.git", "git+https://gitlab.example.com/ml/lmspec.git", True),
        ("ssh://git@host:2222/ml/lmspec.git", "git+ssh://git@host:2222/ml/lmspec.git", True),
        ("/srv/git/lmspec.git", "git+file:///srv/git/lmspec.git", False),
    ],
    ids=["scp-like", "https", "ssh-port", "local-path"],
)
def test_editable_checkout_names_its_remote_at_head(tmp_path: Path, sh, remote: str, url: str, reachable: bool) -> None:
    commit = _checkout(tmp_path / "lmspec", sh, remote)
    record = {"url": (tmp_path / "lmspec").as_uri(), "dir_info": {"editable": True}}
    source = install_source(record, "0.1.0")
    assert (source.requirement, source.reachable) == (f"lmspec @ {url}@{commit}", reachable)
    assert commit[:12] in source.origin and "uncommitted" not in source.origin
    assert _pip_url(source.requirement) == f"{url}@{commit}"


def test_checkout_in_a_subdirectory_with_local_changes(tmp_path: Path, sh) -> None:
    commit = _checkout(tmp_path / "mono", sh, "https://example.com/mono.git")
    package = tmp_path / "mono" / "tools" / "lmspec"
    package.mkdir(parents=True)
    source = install_source({"url": package.as_uri(), "dir_info": {}}, "0.1.0")
    assert source.requirement == f"lmspec @ git+https://example.com/mono.git@{commit}#subdirectory=tools/lmspec"
    assert "uncommitted changes" not in source.origin  # an empty new directory is no change to git
    (package / "pyproject.toml").write_text("[project]\nname = 'lmspec'\n")
    assert (
        "uncommitted changes in that checkout are not in it"
        in install_source({"url": package.as_uri(), "dir_info": {}}, "0.1.0").origin
    )


@pytest.mark.parametrize("git", [True, False], ids=["git-without-remote", "plain-directory"])
def test_directory_ci_cannot_reach_is_said_so(tmp_path: Path, sh, git: bool) -> None:
    directory = tmp_path / "lmspec"
    if git:
        _checkout(directory, sh, remote=None)
    else:
        directory.mkdir()
    source = install_source({"url": directory.as_uri(), "dir_info": {"editable": True}}, "0.1.0")
    assert source.requirement == f"lmspec @ {directory.as_uri()}" and not source.reachable
    assert f"the directory {directory} on this machine" in source.origin


def test_this_install_is_how_this_copy_was_installed() -> None:
    """This venv: README's `pip install -e .` of this checkout (a clone in CI, whose origin is a path)."""
    source = this_install()
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    remotes = subprocess.run(["git", "-C", str(ROOT), "remote"], capture_output=True, text=True, check=False)
    if head.returncode == 0 and remotes.stdout.split():
        assert source.requirement.endswith(f"@{head.stdout.strip()}")
    else:
        assert source.requirement == f"lmspec @ {ROOT.as_uri()}" and not source.reachable
    Requirement(source.requirement)
