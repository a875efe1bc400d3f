"""Hostile spec files and overrides at load time: each exits 1 (spec invalid) or 2 (usage/IO) with
one line naming the file:line or the key and the fix, no traceback, and never hangs.

What they exercise: compiler/spec/yaml_files.py (one checked libyaml parse of every YAML file the
composition reads: tags, YAML 1.1 numbers, duplicate keys, aliases, nesting, encoding, the
defaults list's shape) and composition's hooks and re-phrasings (compiler/spec/load.py and the modules
it calls: include loops, missing configs, group overrides, empty merges, interpolations, the override
grammar).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from helpers.tree import snapshot

from lmspec.compiler.spec.yaml_files import MAX_FILE_BYTES

HEAD = "defaults:\n  - config\n  - _self_\nname: hostile\n"  # lines 1-4 of most specs below
SPEC = ["--spec", "{tmp}/spec.yaml"]
FIFO, DIRECTORY = object(), object()  # file kinds that are not text


def _bomb(levels: int = 9) -> str:
    """The billion laughs: each level is a list of nine aliases of the one before (9**levels values)."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def _interpolation_bomb(levels: int = 9) -> str:
    """The same through OmegaConf: each level a list of nine `${...}` of the one before."""
    lines = ["z0: [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"z{i}: [{', '.join([repr(f'${{z{i - 1}}}')] * 9)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


# (files written under tmp, argv after `check`, expected exit code, fragments stderr must contain)
CASES = [
    # --- tags: only plain YAML values; OmegaConf would build bytes, sets, dates or fail later
    pytest.param(
        {"spec.yaml": HEAD + "train:\n  seed: !!binary aGVsbG8=\n"},
        SPEC,
        1,
        ["spec.yaml:6", "train.seed", "!!binary", "write a plain value"],
        id="tag-binary",
    ),
    pytest.param(
        {"spec.yaml": HEAD + 'train:\n  seed: !!python/object/apply:os.system ["echo pwned"]\n'},
        SPEC,
        1,
        ["spec.yaml:6", "train.seed", "!!python/object/apply:os.system", "not allowed"],
        id="tag-python",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "train:\n  seed: !!set {a, b}\n"}, SPEC, 1, ["train.seed", "!!set"], id="tag-set"
    ),
    pytest.param(
        {"spec.yaml": HEAD + "train:\n  seed: !!timestamp 2024-01-01\n"},
        SPEC,
        1,
        ["train.seed", "!!timestamp"],
        id="tag-timestamp",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "train:\n  seed: !!omap [a: 1]\n"}, SPEC, 1, ["train.seed", "!!omap"], id="tag-omap"
    ),
    pytest.param(
        {"spec.yaml": HEAD + "serve:\n  host: !vault abc\n"}, SPEC, 1, ["serve.host", "!vault"], id="tag-custom"
    ),
    pytest.param(
        {"spec.yaml": HEAD + "train:\n  steps: !!int abc\n"},
        SPEC,
        1,
        ["spec.yaml:6", "train.steps", "'abc' is not a !!int", "drop the tag"],
        id="tag-int-on-a-word",
    ),
    # --- YAML 1.1 numbers that read as something else than they look like
    pytest.param(
        {"spec.yaml": HEAD + "cluster:\n  master_port: 8:20\n"},
        SPEC,
        1,
        ["spec.yaml:6", "cluster.master_port", "base-60", "(500)", 'quote it ("8:20") or write 500'],
        id="sexagesimal-int",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "train:\n  optimizer:\n    lr: 1:30.5\n"},
        SPEC,
        1,
        ["spec.yaml:7", "train.optimizer.lr", "base-60", "write 90.5"],
        id="sexagesimal-float",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "cluster:\n  master_port: 010\n"},
        SPEC,
        1,
        ["cluster.master_port", "octal", "write 8"],
        id="octal-int",
    ),
    # --- duplicate keys: an error (as OmegaConf makes it), naming both lines
    pytest.param(
        {"spec.yaml": HEAD + "name: other\n"},
        SPEC,
        1,
        ["spec.yaml:5", "name: duplicate key (first set on line 4)", "keep one"],
        id="duplicate-key",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "train:\n  steps: 3\n  steps: 4\n"},
        SPEC,
        1,
        ["spec.yaml:7", "train.steps: duplicate key (first set on line 6)"],
        id="duplicate-nested-key",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "? [a, b]\n: c\n"},
        SPEC,
        1,
        ["spec.yaml:5", "a key must be a plain word"],
        id="complex-key",
    ),
    # --- aliases: counted, never expanded; bounded
    pytest.param({"spec.yaml": HEAD + _bomb()}, SPEC, 1, ["spec.yaml", "aliases expand to"], id="alias-bomb"),
    pytest.param(
        {
            "spec.yaml": "defaults:\n  - config\n  - override model: laughs\n  - _self_\nname: hostile\n",
            "model/laughs.yaml": _bomb(),
        },
        SPEC,
        1,
        ["model/laughs.yaml", "aliases expand to", "use fewer aliases"],
        id="alias-bomb-in-a-group-file",
    ),
    pytest.param(
        {"spec.yaml": HEAD + _interpolation_bomb()},
        SPEC,
        1,
        ["z9 (", "spec.yaml:14)", "its interpolations copy", "refer to fewer or smaller sections"],
        id="interpolation-bomb",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "train:\n  optimizer: &o\n    lr: 0.1\n    again: *o\n"},
        SPEC,
        1,
        ["train.optimizer.again", "refers to the value that contains it"],
        id="alias-inside-itself",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "train:\n  steps: *nowhere\n"},
        SPEC,
        1,
        ["spec.yaml:6", "undefined alias"],
        id="alias-undefined",
    ),
    pytest.param(
        {"spec.yaml": HEAD + f"x: {_nested(200)}\n"},
        SPEC,
        1,
        ["spec.yaml:5", "nested deeper than 32"],
        id="deep-nesting",
    ),
    # --- the defaults list (its item includes itself, or has the wrong shape)
    pytest.param(
        {"spec.yaml": "defaults:\n  - spec\n  - _self_\nname: hostile\n"},
        SPEC,
        1,
        ["spec.yaml: its defaults list includes itself (spec -> spec)", "remove that entry"],
        id="defaults-include-self",
    ),
    pytest.param(
        {"spec.yaml": "defaults:\n  - other\n  - _self_\n", "other.yaml": "defaults:\n  - spec\n  - _self_\n"},
        SPEC,
        1,
        ["includes itself (spec -> other -> spec)"],
        id="defaults-include-each-other",
    ),
    pytest.param(
        {"spec.yaml": HEAD, "config.yaml": "defaults:\n  - config\n  - _self_\n"},
        SPEC,
        1,
        ["config.yaml: its defaults list includes itself", "rename config.yaml", "searched before lmspec's specs/"],
        id="defaults-user-config-shadows-builtin",
    ),
    pytest.param(
        {"spec.yaml": "defaults: 5\nname: hostile\n"},
        SPEC,
        1,
        ["spec.yaml:1", "defaults: must be a list, not 5", "- model: tiny"],
        id="defaults-int",
    ),
    pytest.param(
        {"spec.yaml": "defaults: [5]\nname: hostile\n"},
        SPEC,
        1,
        ["spec.yaml:1", "defaults[0]: 5 is not a config name"],
        id="defaults-list-of-int",
    ),
    pytest.param(
        {"spec.yaml": "defaults:\nname: hostile\n"}, SPEC, 1, ["defaults: must be a list"], id="defaults-null"
    ),
    pytest.param(
        {"spec.yaml": "defaults:\n  model: tiny\nname: hostile\n"},
        SPEC,
        1,
        ["defaults: must be a list, not a mapping"],
        id="defaults-mapping",
    ),
    pytest.param(
        {"spec.yaml": "defaults:\n  - config\n  - {model: tiny, serve: default}\nname: hostile\n"},
        SPEC,
        1,
        ["spec.yaml:3", "defaults[1]: one entry names one config or one group"],
        id="defaults-two-keys-in-one-entry",
    ),
    pytest.param(
        {"spec.yaml": "defaults:\n  - config\n  - override model: 5\nname: hostile\n"},
        SPEC,
        1,
        ["defaults[1]: a group's choice must be a config name"],
        id="defaults-choice-int",
    ),
    pytest.param(
        {"spec.yaml": "defaults:\n  - config\n  - override model: tiny_moe\n  - model: [tiny, tiny_moe]\nname: x\n"},
        SPEC,
        1,
        ["spec.yaml:4", "defaults[2]: comes after the override on line 3: overrides go at the end"],
        id="defaults-entry-after-an-override",
    ),
    pytest.param(
        {"spec.yaml": HEAD.replace("  - _self_\n", "  - _self_\n  - _self_\n")},
        SPEC,
        1,
        ["spec.yaml:4", "a second _self_ (the first is on line 3)"],
        id="defaults-self-twice",
    ),
    pytest.param(
        {"spec.yaml": "defaults:\n  - nonexistent\n  - _self_\nname: hostile\n"},
        SPEC,
        1,
        ["nonexistent: no such config (", "spec.yaml:2)", "looked for nonexistent.yaml in"],
        id="defaults-missing-config",
    ),
    pytest.param(
        {"spec.yaml": "defaults:\n  - config\n  - override model: llama9\n  - _self_\nname: hostile\n"},
        SPEC,
        1,
        ["model/llama9: no such config (", "spec.yaml:3)", "model has: ", "did you mean llama3_8b?"],
        id="defaults-missing-group-option",
    ),
    # --- what a spec file is: text, UTF-8, one mapping, a regular .yaml file
    pytest.param(
        {"spec.yaml": "just a sentence\n"}, SPEC, 1, ["spec.yaml:1", "holds the single value"], id="scalar-file"
    ),
    pytest.param({"spec.yaml": "42\n"}, SPEC, 1, ["holds the single value '42'", "mapping of keys"], id="number-file"),
    pytest.param({"spec.yaml": "- a\n- b\n"}, SPEC, 1, ["spec.yaml:1", "holds a list"], id="list-file"),
    pytest.param({"spec.yaml": ""}, SPEC, 1, ["spec.yaml: empty"], id="empty-file"),
    pytest.param({"spec.yaml": "# nothing but a comment\n"}, SPEC, 1, ["spec.yaml: empty"], id="comment-only-file"),
    pytest.param(
        {"spec.yaml": b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe"},
        SPEC,
        1,
        ["spec.yaml:1", "not UTF-8 text (byte 0x89 at offset 0)", "save it as UTF-8"],
        id="binary-garbage",
    ),
    pytest.param(
        {"spec.yaml": HEAD.encode().replace(b"hostile", b"caf\xe9")},
        SPEC,
        1,
        ["spec.yaml:4", "not UTF-8 text (byte 0xe9"],
        id="latin-1-file",
    ),
    pytest.param(
        {"spec.yaml": HEAD.replace("hostile", "host\x00ile")},
        SPEC,
        1,
        ["spec.yaml:4", "character #x0000", "remove it"],
        id="nul-byte",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "train:\n\tsteps: 3\n"}, SPEC, 1, ["spec.yaml:6", "not tabs"], id="tab-indentation"
    ),
    pytest.param(
        {"spec.yaml": HEAD + "---\nname: second\n"},
        SPEC,
        1,
        ["spec.yaml:5", "expected a single document"],
        id="two-documents",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "parallel: {tp: 2\n"}, SPEC, 1, ["spec.yaml:6", "YAML syntax error"], id="yaml-syntax"
    ),
    pytest.param({"spec.yaml": DIRECTORY}, SPEC, 2, ["spec.yaml: a directory", "give a spec file"], id="spec-is-dir"),
    pytest.param({"spec.yaml": FIFO}, SPEC, 2, ["spec.yaml: not a regular file"], id="spec-is-fifo"),
    pytest.param(
        {"spec.yml": HEAD},
        ["--spec", "{tmp}/spec.yml"],
        2,
        ["expected a .yaml file (rename it to spec.yaml)"],
        id="yml",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "#" * MAX_FILE_BYTES + "\n"},
        SPEC,
        2,
        ["spec.yaml:", f"a spec file is at most {MAX_FILE_BYTES} bytes"],
        id="huge-file",
    ),
    pytest.param(
        {
            "spec.yaml": "defaults:\n  - config\n  - override hardware: mine\n  - _self_\nname: hostile\n",
            "hardware/mine.yaml": "defaults:\n  - a100_80g\n  - _self_\nnodes: 2\nnodes: 3\n",
        },
        SPEC,
        1,
        ["hardware/mine.yaml:5", "nodes: duplicate key"],
        id="duplicate-key-in-a-group-file",
    ),
    # --- interpolations name the key the user set, or the key that is missing
    pytest.param(
        {"spec.yaml": HEAD + "train: 5\n"},
        SPEC,
        1,
        ["train (", "spec.yaml:5) is 5, not a mapping", "train must be a mapping"],
        id="section-replaced-by-a-number",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "model: [1]\n"},
        SPEC,
        1,
        ["spec.yaml: Cannot merge DictConfig with ListConfig"],
        id="section-replaced-by-a-list",
    ),
    pytest.param(
        {
            "spec.yaml": "defaults:\n  - model: tiny\n  - parallel: default\n  - train: default\n  - serve: default\n"
            "  - cluster: local\n  - convert: default\n  - hardware: cpu\n  - _self_\n"
        },
        SPEC,
        1,
        ["name: missing", "train.checkpoint.dir (", "uses it as ${name}", "+name=..."],
        id="no-name-key",
    ),
    pytest.param(
        {"spec.yaml": HEAD + "train:\n  checkpoint:\n    dir: runs/${nmae}\n"},
        SPEC,
        1,
        ["train.checkpoint.dir (", "spec.yaml:7)", "${nmae} names no key", "did you mean name?"],
        id="interpolation-typo-in-file",
    ),
    pytest.param(
        {},
        ["name=${nope}"],
        1,
        ["'name=${nope}' (command-line override)", "names no key"],
        id="interpolation-missing-override",
    ),
    pytest.param(
        {},
        ["train.checkpoint.dir=runs/${nme}"],
        1,
        ["'train.checkpoint.dir=runs/${nme}' (command-line override)", "did you mean name?"],
        id="interpolation-typo-override",
    ),
    pytest.param({}, ["name=${name}"], 1, ["'name=${name}'", "refers back to itself"], id="interpolation-loop"),
    pytest.param(
        {},
        ["name=${oc.env:LMSPEC_HOSTILE_UNSET}"],
        1,
        ["'name=${oc.env:LMSPEC_HOSTILE_UNSET}' (command-line override)", "LMSPEC_HOSTILE_UNSET"],
        id="interpolation-unset-env",
    ),
    pytest.param(
        {}, ["name=${nosuch:resolver}"], 1, ["'name=${nosuch:resolver}'", "nosuch"], id="interpolation-bad-resolver"
    ),
    pytest.param({}, ["~model"], 1, ["model: missing (removed by '~model')", "name ("], id="section-deleted"),
    # --- groups chosen on the command line
    pytest.param(
        {}, ["model=null"], 1, ["model=null (command-line override)", "model=OPTION", "tiny_moe"], id="model-null"
    ),
    pytest.param(
        {}, ["hardware=null"], 1, ["hardware=null (command-line override)", "one of a100_40g"], id="hardware-null"
    ),
    pytest.param({}, ["model=5"], 1, ["model=5 (command-line override)", "5 is not one"], id="model-number"),
    pytest.param({}, ["model=[]"], 1, ["model=[]", "an empty list chooses none"], id="model-empty-list"),
    pytest.param({}, ["model=''"], 1, ["model=''", "'' is not one"], id="model-empty-string"),
    pytest.param(
        {}, ["model=llama9"], 1, ["model/llama9: no such config (model=llama9, command-line override)"], id="model-typo"
    ),
    pytest.param({}, ["+model=tiny"], 1, ["+model=tiny", "drop the '+'", ": model=tiny"], id="model-added-twice"),
    # --- an empty mapping merges nothing: an error, not the defaults
    pytest.param(
        {},
        ["parallel={}"],
        1,
        ["parallel={} (command-line override): an empty mapping merges nothing", "parallel=OPTION", "~parallel"],
        id="parallel-empty-mapping",
    ),
    pytest.param({}, ["train={}"], 1, ["train={}", "train.KEY=VALUE"], id="train-empty-mapping"),
    pytest.param({}, ["train.optimizer={}"], 1, ["train.optimizer={}", "merges nothing"], id="optimizer-empty"),
    pytest.param(
        {},
        ["model.moe.num_experts=8"],
        1,
        ["model.moe.num_experts (command-line override): model.moe is not set", "model.moe={num_experts: ..."],
        id="key-under-null-section",
    ),
    pytest.param(
        {},
        ["train=${model}"],
        1,
        ["train=${model} (command-line override)", "an interpolation, not a preset's name"],
        id="group-choice-interpolation",
    ),
    pytest.param(
        {"spec.yaml": "defaults:\n  - config\n  - override model: ${oc.select:nope}\nname: hostile\n"},
        SPEC,
        1,
        ["spec.yaml:3", "defaults[1]: a group's choice must be a config name"],
        id="defaults-choice-interpolation",
    ),
    # --- Hydra's own settings: lmspec only composes, they would do nothing (or crash Hydra)
    pytest.param(
        {"spec.yaml": HEAD + "hydra:\n"}, SPEC, 1, ["spec.yaml:5", "hydra: Hydra's own settings"], id="hydra-in-file"
    ),
    pytest.param(
        {},
        ["hydra.run.dir=x"],
        1,
        ["hydra.run.dir=x (command-line override)", "no effect"],
        id="hydra-setting-override",
    ),
    pytest.param({}, ["hydra=null"], 1, ["hydra=null (command-line override)", "remove it"], id="hydra-null"),
    # --- the override grammar: which override, quoted
    pytest.param(
        {},
        ["parallel.tp=2", "train.steps=f("],
        2,
        ["cannot parse override 'train.steps=f('", "quoted"],
        id="grammar-paren",
    ),
    pytest.param({}, ["train.steps=[1"], 2, ["cannot parse override 'train.steps=[1'"], id="grammar-open-list"),
    pytest.param({}, ["parallel.tp=="], 2, ["cannot parse override 'parallel.tp=='"], id="grammar-double-equals"),
    pytest.param({}, ["name=a'b"], 2, ['cannot parse override "name=a\'b"', "position 7"], id="grammar-quote"),
    pytest.param({}, ["=5"], 2, ["'=5': no key before the '='"], id="grammar-no-key"),
    pytest.param({}, ["name=x,y"], 2, ["'name=x,y': a sweep", "lmspec compile -m", "name='a,b'"], id="sweep-no-m"),
    pytest.param(
        {},
        ["cluster.master_port=8:20"],
        1,
        ['cluster.master_port="8:20" (command-line override)', "expected an integer"],
        id="sexagesimal-override-stays-a-string",
    ),
]


def _write(tmp: Path, files: dict[str, object]) -> None:
    for name, content in files.items():
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if content is DIRECTORY:
            path.mkdir()
        elif content is FIFO:
            os.mkfifo(path)
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            assert isinstance(content, str)
            path.write_text(content, encoding="utf-8")


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 30


@pytest.mark.timeout(20)  # the alias bombs: OmegaConf alone would expand 9**9 values
@pytest.mark.parametrize(("files", "argv", "code", "fragments"), CASES)
def test_hostile_load_fails_cleanly(
    lmspec, tmp_path: Path, files: dict[str, object], argv: list[str], code: int, fragments: list[str]
) -> None:
    _write(tmp_path, dict(files))
    result = lmspec("check", *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    result.assert_reports(code, fragments)
    assert len([line for line in result.err.splitlines() if line.startswith("error:")]) <= 2, result.err


@pytest.mark.timeout(20)
def test_failed_loads_leave_the_build_root_exactly_as_it_was(lmspec, tmp_path: Path) -> None:
    out = tmp_path / "build"
    assert lmspec("compile", "-o", str(out)).code == 0
    before = snapshot(out)
    specs = tmp_path / "specs"
    _write(specs, {"bomb.yaml": HEAD + _bomb(), "binary.yaml": HEAD + "name2: !!binary aGk=\n", "self.yaml": ""})
    for argv in (
        ["--spec", str(specs / "bomb.yaml")],
        ["--spec", str(specs / "binary.yaml")],
        ["--spec", str(specs / "self.yaml")],
        ["parallel={}"],
        ["model=null"],
        ["train.steps=f("],
    ):
        result = lmspec("compile", "-o", str(out), *argv)
        assert result.code in (1, 2) and "Traceback" not in result.err, result.err
        assert snapshot(out) == before
    sweep = lmspec("compile", "-o", str(out), "-m", "parallel.tp=1,2", "train.steps=f(")
    sweep.assert_reports(2, ["cannot parse override 'train.steps=f('"])
    assert snapshot(out) == before


def test_plain_yaml_that_is_meant_still_loads(lmspec, tmp_path: Path) -> None:
    """What the checks must not refuse: a few aliases, a merge key, quoted base-60 text, a date-like
    name (a string: OmegaConf has no timestamps), explicit plain tags, a byte-order mark."""
    spec = tmp_path / "spec.yaml"
    spec.write_bytes(
        b"\xef\xbb\xbf"
        + (
            b"defaults:\n  - config\n  - _self_\n"
            b"name: 2024-01-01\n"
            b"train:\n"
            b"  checkpoint: &ckpt\n    interval: !!int '5'\n    keep_last_k: 3\n"
            b"  steps: !!int 40\n"
            b"convert:\n  output: !!str runs/converted\n"
            b"cluster:\n  slurm:\n    time: '8:20:00'\n"
        )
    )
    result = lmspec("explain", "--format", "json", "--spec", str(spec))
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["spec"]["name"] == "2024-01-01"
    assert doc["spec"]["train"]["checkpoint"]["interval"] == 5
    assert doc["spec"]["cluster"]["slurm"]["time"] == "8:20:00"
    assert doc["origins"]["train.checkpoint.interval"] == f"{spec}:7"
    assert doc["origins"]["train.steps"] == f"{spec}:9"
    assert doc["origins"]["cluster.slurm.time"] == f"{spec}:14"


def test_aliases_within_the_bound_load_and_keep_provenance(lmspec, tmp_path: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        HEAD + "x-common: &common\n  steps: 12\n  seed: 7\ntrain:\n  <<: *common\n  log_interval: 3\n",
        encoding="utf-8",
    )
    # the merge key pulls x-common into train; the x-common key itself is unknown to the schema
    result = lmspec("check", "--spec", str(spec))
    result.assert_reports(1, ["x-common (", "spec.yaml:5", "unknown key"])
    spec.write_text(HEAD + "train:\n  steps: &n 12\n  log_interval: *n\n", encoding="utf-8")
    result = lmspec("explain", "--format", "json", "--spec", str(spec))
    assert result.code == 0, result.err
    doc = json.loads(result.out)
    assert doc["spec"]["train"]["log_interval"] == 12
    assert doc["origins"]["train.log_interval"] == f"{spec}:7"
