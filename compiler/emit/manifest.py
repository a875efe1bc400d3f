"""A whole build as text: every artifact of the Plan plus manifest.json, the record of how it was made.

The emitters write the artifacts (compiler/emit/__init__.py); this adds the manifest that names each
file's sha256, which `Build.open` checks before the runtime reads anything, and then the launcher's carried
files (its `carries`: Kubernetes' build ConfigMap), made from the finished files and the manifest itself, so
the manifest cannot list them. Writing the files is compiler/build/writer.py's: it writes and drift-checks
them like any other; the ownership test admits them by name (compiler/build/files.py CARRIED).
"""

from __future__ import annotations

from lmspec.compiler.build.digest import sha256
from lmspec.compiler.build.files import CARRIED, MANIFEST, SPEC
from lmspec.compiler.emit import emit_all
from lmspec.compiler.emit.memory_chart import chart_key, drawn_key
from lmspec.compiler.emit.spec_files import dump_json
from lmspec.compiler.launchers import launcher_of
from lmspec.compiler.plan import Plan


def build_files(plan: Plan) -> dict[str, str]:
    """Every artifact of the plan plus manifest.json, which records how the build was made, and the files the
    launcher carries (made from those, not listed in the manifest).

    The compile's inputs hold the chart of the build these files will replace or be checked
    against (compiler/inputs.py): an untouched chart drawn from the same numbers is kept instead
    of redrawn.
    """
    earlier_chart = plan.inputs.earlier_chart
    kept = earlier_chart is not None and drawn_key(earlier_chart) == chart_key(plan)
    files = emit_all(plan, chart=earlier_chart if kept else None)
    files[MANIFEST] = dump_json(
        {
            "lmspec_version": plan.lmspec_version,
            "name": plan.name,
            "overrides": list(plan.overrides),
            "choices": dict(plan.choices),
            "spec_sha256": sha256(files[SPEC]),
            "files": {path: sha256(text) for path, text in files.items()},
        }
    )
    carries = launcher_of(plan.spec.cluster).carries
    carried = carries(plan, files) if carries is not None else {}
    if not carried.keys() <= set(CARRIED) or carried.keys() & files.keys():
        raise RuntimeError(f"carried files {sorted(carried)} are not among {CARRIED} or rewrite listed files")
    return dict(sorted({**files, **carried}.items()))
