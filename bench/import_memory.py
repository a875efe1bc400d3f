"""Peak RSS of `lmspec run BUILD --stage import --from HF_DIR` per rank, against the largest tensor it read.

    python bench/import_memory.py BUILD_DIR HF_DIR     (from the directory the build's runs/ live in)

Each rank of the import (lmspec.runtime.convert.from_hf) prints its model shard, the largest mapping row it
read (HF tensors, dequantised) and its peak RSS before saving; this prints them as a table. The streaming
bound: peak RSS - (interpreter + torch + megatron + model shard and optimizer) stays within a small multiple
of the largest row, whatever the size of the checkpoint.
"""

from __future__ import annotations

import re
import subprocess
import sys

LINE = re.compile(
    r"import rank (\d+): (\d+) tensors, model shard ([\d.]+) MiB, largest read ([\d.]+) MiB, peak RSS ([\d.]+) MiB"
)


def main(argv: list[str]) -> int:
    build, hf_dir = argv
    result = subprocess.run(
        ["lmspec", "run", build, "--stage", "import", "--from", hf_dir], capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        print(result.stderr[-3000:], file=sys.stderr)
        return result.returncode
    print("| rank | tensors | model shard MiB | largest read MiB | peak RSS MiB |\n|---|---|---|---|---|")
    for match in sorted(LINE.finditer(result.stdout), key=lambda m: int(m.group(1))):
        print("| " + " | ".join(match.groups()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
