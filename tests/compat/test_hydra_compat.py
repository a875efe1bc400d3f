"""What lmspec.compiler.spec.hydra_compat relies on in the installed Hydra, checked against Hydra itself.

Each test fails when hydra-core changes the behaviour a hook or a wording match depends on:
the private functions by name and signature, that Hydra calls them during `compose` (so the
hooks run) and that they are Hydra's own again afterwards, the attributes of
MissingConfigException, and the texts of the errors that carry nothing else.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_dir
from hydra._internal import config_loader_impl, defaults_list
from hydra._internal.core_plugins import file_config_source
from hydra.core.default_element import DefaultsTreeNode, ResultDefault
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException

from lmspec.compiler.spec import hydra_compat

CONFIG = {"defaults": [{"group": "a"}, "_self_"], "name": "x", "section": {"key": 1}}


@pytest.fixture
def config_dir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "group").mkdir()
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    (tmp_path / "group" / "a.yaml").write_text("value: 1\n")
    (tmp_path / "group" / "b.yaml").write_text("value: 2\n")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        yield tmp_path
    GlobalHydra.instance().clear()


def _error(overrides: list[str]) -> Exception:
    with pytest.raises(Exception) as info:
        compose("config", overrides=overrides)
    return info.value


def _hooked() -> tuple[Any, ...]:
    return (
        file_config_source.FileConfigSource.load_config,
        defaults_list._create_defaults_tree_impl,
        defaults_list.config_not_found_error,
        config_loader_impl.create_defaults_list,
    )


def test_the_installed_hydra_is_the_release_the_seam_was_written_for() -> None:
    hydra_compat.require_hydra()
    assert hydra_compat.hydra_version_problem("1.3.2") is None
    problem = hydra_compat.hydra_version_problem("1.4.0")
    assert problem is not None
    assert "hydra-core 1.4.0 is installed" in problem and "hydra-core 1.3.x" in problem


def test_the_private_functions_have_the_signatures_the_hooks_take() -> None:
    def names(function: Any) -> list[str]:
        return list(inspect.signature(function).parameters)

    assert names(defaults_list._create_defaults_tree_impl) == [
        "repo",
        "root",
        "is_root_config",
        "skip_missing",
        "interpolated_subtree",
        "overrides",
    ]
    assert names(defaults_list.config_not_found_error) == ["repo", "tree"]
    assert names(config_loader_impl.create_defaults_list) == [
        "repo",
        "config_name",
        "overrides_list",
        "prepend_hydra",
        "skip_missing",
    ]
    assert names(file_config_source.FileConfigSource.load_config) == ["self", "config_path"]
    assert callable(file_config_source.FileConfigSource._normalize_file_name)
    assert callable(file_config_source.FileConfigSource._get_header_dict)
    assert list(inspect.signature(defaults_list.DefaultsList).parameters)[0] == "defaults"


def test_compose_calls_every_hook_and_hydra_is_its_own_again_after(config_dir: Path) -> None:
    before = _hooked()
    files: list[str] = []
    nodes: list[DefaultsTreeNode] = []
    built: list[list[ResultDefault]] = []

    def read(config_path: str, path: Path) -> tuple[dict[str, Any] | None, str]:
        files.append(config_path)
        text = path.read_text()
        return yaml.safe_load(text), text

    def missing(exc: MissingConfigException, tree: DefaultsTreeNode, searched: list[str]) -> Exception:
        return LookupError(exc.missing_cfg_file, list(exc.options or []), searched)

    with hydra_compat.composition_hooks(read, nodes.append, missing, built.append):
        cfg = compose("config", overrides=["group=b"])
        with pytest.raises(LookupError) as info:
            compose("config", overrides=["group=nope"])
    assert _hooked() == before
    assert cfg.group.value == 2 and cfg.section.key == 1
    assert {"config", "group/b"} <= set(files)
    assert any(n.node.get_config_path() == "config" for n in nodes if not n.node.is_virtual())
    assert [d.config_path for d in built[0] if d.config_path in ("config", "group/b")] == ["group/b", "config"]
    assert info.value.args == ("group/nope", ["a", "b"], [str(config_dir)])


def test_the_hooks_are_undone_when_the_composition_fails(config_dir: Path) -> None:
    before = _hooked()

    def refuse(node: DefaultsTreeNode) -> None:
        raise RuntimeError("refused")

    with (
        pytest.raises(RuntimeError, match="refused"),
        hydra_compat.composition_hooks(lambda c, p: ({}, ""), refuse, lambda e, t, s: e, lambda d: None),
    ):
        compose("config")
    assert _hooked() == before


def test_missing_config_carries_the_attributes_read_instead_of_its_text(config_dir: Path) -> None:
    exc = _error(["group=nope"])
    assert isinstance(exc, MissingConfigException)
    assert exc.missing_cfg_file == "group/nope" and list(exc.options or []) == ["a", "b"]
    text = hydra_compat.without_search_path(str(exc))
    assert "provider=" not in text and "Could not find 'group/nope'" in text
    assert hydra_compat.merging_config(text) == ("config", text.removeprefix("In 'config': "))


def test_the_wordings_matched_are_hydras(config_dir: Path) -> None:
    unknown = _error(["section.nokey=1"])
    assert isinstance(unknown, ConfigCompositionException)
    assert hydra_compat.cannot_override(str(unknown), "section.nokey")
    assert not hydra_compat.cannot_override(str(unknown), "section")
    appended = _error(["+name=y"])
    assert hydra_compat.cannot_append(str(appended), "name")
    twice = _error(["+group=a"])  # the option the defaults list already chooses
    assert hydra_compat.chosen_twice(str(twice), "group")


@pytest.mark.parametrize(
    ("override", "detail"),
    [
        ("a=b`", "unexpected character '`' at position 4"),
        ("a=b)", "extraneous input ')' expecting <EOF>"),
        ("a=[1,2", "no viable alternative at input '[1,2'"),
        ("a=b,", "mismatched input '<EOF>'"),
    ],
)
def test_grammar_errors_read_as_before(override: str, detail: str) -> None:
    with pytest.raises(OverrideParseException) as info:
        OverridesParser.create().parse_overrides([override])
    got = hydra_compat.grammar_error_detail(info.value)
    assert got == detail


def test_the_sweep_splits_as_hydras_basic_sweeper() -> None:
    parsed = OverridesParser.create().parse_overrides(["a=1,2", "b=x", "c=3,4"])
    assert hydra_compat.split_sweep(parsed) == [
        ["a=1", "b=x", "c=3"],
        ["a=1", "b=x", "c=4"],
        ["a=2", "b=x", "c=3"],
        ["a=2", "b=x", "c=4"],
    ]
