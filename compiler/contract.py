"""The build contract: which of the compiler's modules the runtime may import.

The runtime reads a build through `Build.open` (compiler/build/reader.py), the typed Plan
(compiler/plan.py) and the file names (compiler/build/files.py), and uses pure helpers that the
compiler shares with it: the models (compiler/models/), the families and the conversion table,
the spec's typed sections, the errors, the data sidecars and tokenizer files (compiler/data/), the
run directories (compiler/run_paths.py), the atomic writes (compiler/build/atomic.py), the
launcher table (compiler/launchers/), and what the emitted scripts and the runtime must spell alike
(compiler/launch_names.py, compiler/endpoint.py, the file names' serve_scripts) or check alike
(compiler/vllm_cpu.py, which a rule and the serve stage both run; compiler/spec/shown_key.py, the
words of its messages). Everything a compile does beyond that is the compiler's alone: the rules
check a spec, the emitters write a build, the commands and the search drive them. A rank that
imported them would judge the job again by its own lmspec instead of running what was compiled,
and would load all of them to do it.

So the runtime may import any compiler module except those below, directly or through another
compiler module (function-level imports included); tests/compiler/test_import_graph.py walks
every runtime module's imports to hold it.
"""

from __future__ import annotations

RUNTIME_FORBIDDEN: tuple[str, ...] = (
    "lmspec.compiler.rules",  # what a spec may be: checked at compile time, recorded by the build
    "lmspec.compiler.emit",  # the artifacts: the runtime reads them from the build
    "lmspec.compiler.cli",  # the commands
    "lmspec.compiler.search",  # `lmspec plan`
    "lmspec.compiler.pipeline",  # spec -> Plan -> build, the compile itself
)
