"""No launcher or training-backend name is compared outside its own module (compiler/launchers/<name>.py,
compiler/backends/<name>.py) and its registry: everything else asks `launcher_of(spec.cluster)` or
`backend_of(spec)`. The scanner (tests/helpers/plugin_names.py) is shown to find each shape of comparison
first, so a clean scan means something."""

from __future__ import annotations

import pytest
from helpers.paths import ROOT
from helpers.plugin_names import name_comparisons, names_compared_outside

from lmspec.compiler.backends import BACKENDS
from lmspec.compiler.backends.backend import load
from lmspec.compiler.launchers import LAUNCHERS
from lmspec.compiler.spec.schema import spec_schema
from lmspec.runtime.launchers import LauncherRuntime

SUBJECTS = ("launcher",)
OWN = ("compiler/launchers/__init__.py", *(f"compiler/launchers/{name}.py" for name in LAUNCHERS))
BACKEND_SUBJECTS = ("backend",)
BACKENDS_OWN = ("compiler/backends/__init__.py", *(f"compiler/backends/{name}.py" for name in BACKENDS))


def test_no_launcher_name_is_compared_outside_its_module() -> None:
    assert names_compared_outside(ROOT, ("compiler", "runtime"), LAUNCHERS, SUBJECTS, OWN) == []


def test_no_backend_name_is_compared_outside_its_module() -> None:
    assert names_compared_outside(ROOT, ("compiler", "runtime"), BACKENDS, BACKEND_SUBJECTS, BACKENDS_OWN) == []


@pytest.mark.parametrize(
    "source",
    [
        "if spec.train.backend == 'deepspeed':\n    pass\n",
        "megatron = t.backend != 'megatron'\n",
        "if doc['backend'] != 'deepspeed':\n    pass\n",  # a document's field, read by subscript
        "label = 'zero' if v['train.backend'] == 'deepspeed' else 'dist-opt'\n",
        "ok = BACKENDS[b] in ('deepspeed',)\n",
        "deepspeed = f.backend == BACKENDS.index('deepspeed')\n",
        "match spec.train.backend:\n    case 'megatron':\n        pass\n",
    ],
)
def test_the_scan_finds_each_shape_of_backend_comparison(source: str) -> None:
    assert len(name_comparisons(source, BACKENDS, BACKEND_SUBJECTS)) == 1


@pytest.mark.parametrize(
    "source",
    [
        "if a.style == 'megatron':\n    pass\n",  # the activation layout's name, not a backend
        "if kind == 'deepspeed':\n    pass\n",  # a log format's name (lmspec logs)
        "if backend.zero_sharding:\n    pass\n",  # asking the plug-in
    ],
)
def test_the_scan_passes_other_backend_comparisons(source: str) -> None:
    assert name_comparisons(source, BACKENDS, BACKEND_SUBJECTS) == []


@pytest.mark.parametrize(
    "source",
    [
        "if spec.cluster.launcher == 'slurm':\n    pass\n",
        "slurm = cluster.launcher != 'local'\n",
        "if launcher in ('local', 'slurm'):\n    pass\n",
        "ok = 'slurm' not in {launcher_name}\n",
        "if x > 0 and ['slurm'] == launchers:\n    pass\n",
        "match spec.cluster.launcher:\n    case 'slurm':\n        pass\n",
        "match launcher:\n    case 'other' | 'local':\n        pass\n",
    ],
)
def test_the_scan_finds_each_shape(source: str) -> None:
    assert len(name_comparisons(source, LAUNCHERS, SUBJECTS)) == 1


@pytest.mark.parametrize(
    "source",
    [
        "if t.transformer_impl == 'local':\n    pass\n",  # another key's value, not a launcher
        "impl = 'local' if deepspeed else spec.train.transformer_impl\n",
        "match spec.train.transformer_impl:\n    case 'local':\n        pass\n",
        "if launcher.container:\n    pass\n",  # asking the plug-in: what the rest of the code does
    ],
)
def test_the_scan_passes_other_comparisons(source: str) -> None:
    assert name_comparisons(source, LAUNCHERS, SUBJECTS) == []


def test_the_table_is_keyed_by_each_launchers_name() -> None:
    assert {name: launcher.name for name, launcher in LAUNCHERS.items()} == {name: name for name in LAUNCHERS}


def test_each_launcher_names_its_runtime_record() -> None:
    """`Launcher.runtime` is a name the compiler does not import: here it must resolve to the record `lmspec run`
    starts the build with."""
    assert all(isinstance(load(launcher.runtime), LauncherRuntime) for launcher in LAUNCHERS.values())


def test_cluster_launcher_admits_the_table_and_each_section_exists() -> None:
    cluster = spec_schema()["properties"]["cluster"]["properties"]
    assert cluster["launcher"]["enum"] == list(LAUNCHERS)
    sections = [launcher.section for launcher in LAUNCHERS.values() if launcher.section is not None]
    assert all(section.removeprefix("cluster.") in cluster for section in sections)


def test_the_backend_table_is_keyed_by_each_backends_name_and_is_the_schemas_enum() -> None:
    assert {name: backend.name for name, backend in BACKENDS.items()} == {name: name for name in BACKENDS}
    train = next(choice for choice in spec_schema()["properties"]["train"]["anyOf"] if choice.get("type") == "object")
    assert train["properties"]["backend"]["enum"] == list(BACKENDS)
