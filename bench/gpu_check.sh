#!/usr/bin/env bash
# A short check of lmspec's GPU path on one lent node (H100/H200): trains a ~320M-parameter model at
# seq 2048 for 10 steps per variant (bench/gpu_check.py lists them: bf16 on 1 GPU, FP8 delayed and
# blockwise where Transformer Engine runs on Hopper, TP2+SP / PP2 / CP2 / DP2 with the distributed
# optimizer when 2+ GPUs are visible) and prints measured peak memory and step time next to lmspec's
# estimates. Nothing is downloaded: it uses the interpreter's installed lmspec (this checkout) and TE
# if present; without TE every variant runs the local path and the table says so.
#
#   bash bench/gpu_check.sh [--dry-run] [--hardware PRESET] [--work DIR]
#
# --dry-run compiles every variant (as if TE and 2 Hopper GPUs were there) and prints the table of
# estimates; it needs no GPU. LMSPEC_PYTHON picks the interpreter (default: python3).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
py="${LMSPEC_PYTHON:-python3}"
driver="$here/gpu_check.py"
work="${TMPDIR:-/tmp}/lmspec-gpu-check"
hardware=""
dry_run=0
budget_s=420        # all variants together: the check must stay under 8 minutes
per_variant_s=110   # start-up (imports, dataset index, TE kernels) + 10 steps + the final checkpoint

while (($#)); do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --hardware) hardware="$2"; shift ;;
    --work) work="$2"; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

rm -rf "$work"
mkdir -p "$work/status"

if ((dry_run)); then
  gpus=2; te_flags=(--te); fp8_flags=(--fp8); hardware="${hardware:-h200_141g}"
else
  if ! command -v nvidia-smi >/dev/null; then
    echo "gpu_check.sh: no nvidia-smi: this check needs NVIDIA GPUs (use --dry-run for the estimates)" >&2
    exit 2
  fi
  gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
  gpus="$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)"
  if [[ -z "$hardware" ]]; then
    case "$gpu_name" in
      *H200*) hardware=h200_141g ;;
      *H100*) hardware=h100_80g ;;
      *H800*) hardware=h800_80g ;;
      *A100*80GB*) hardware=a100_80g ;;
      *A100*) hardware=a100_40g ;;
      *) echo "gpu_check.sh: no lmspec hardware preset for '$gpu_name'; pass --hardware PRESET" >&2; exit 2 ;;
    esac
  fi
  te_flags=(); fp8_flags=()
  if "$py" -c 'import transformer_engine.pytorch' >/dev/null 2>&1; then
    te_flags=(--te)
    case "$hardware" in h100_*|h200_*|h800_*) fp8_flags=(--fp8) ;; esac
    echo "gpu_check.sh: $gpus x $gpu_name ($hardware), Transformer Engine present"
  else
    echo "gpu_check.sh: $gpus x $gpu_name ($hardware), Transformer Engine MISSING: local path only, no FP8 or CP"
  fi
  export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron-LM's launch setting (TP/SP comm ordering)
fi

mapfile -t variants < <("$py" "$driver" variants --gpus "$gpus" "${te_flags[@]}" "${fp8_flags[@]}")
"$py" "$driver" compile --hardware "$hardware" --work "$work" "${te_flags[@]}" "${variants[@]}" >/dev/null
started=$SECONDS
for variant in "${variants[@]}"; do
  build="$work/build/gpu_check_$variant"
  if ((dry_run)); then
    echo "compiled" >"$work/status/$variant"
    continue
  fi
  left=$((budget_s - (SECONDS - started)))
  if ((left < 30)); then
    echo "skipped (time budget)" >"$work/status/$variant"
    continue
  fi
  limit=$((left < per_variant_s ? left : per_variant_s))
  echo "gpu_check.sh: training $variant (limit ${limit}s)"
  if (cd "$work" && timeout --kill-after=10 "$limit" "$py" -c \
      'import sys; from lmspec.compiler.cli.main import main; sys.argv[0] = "lmspec"; main()' \
      run "$build" >"$work/status/$variant.log" 2>&1); then
    echo "ok" >"$work/status/$variant"
  else
    echo "failed (exit $?; log status/$variant.log)" >"$work/status/$variant"
    tail -n 5 "$work/status/$variant.log" >&2 || true
  fi
  rm -rf "$work/runs/gpu_check_$variant/checkpoints"  # GBs per variant; the metrics stay
done

"$py" "$driver" table --work "$work"
