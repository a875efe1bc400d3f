"""The derived numbers as plain data: what plan.json and `lmspec explain --format json` carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lmspec.compiler.models.checkpoint_size import CheckpointCadence, CheckpointSize
from lmspec.compiler.models.comm import COMM_SHARE_WARNING, CommEstimate
from lmspec.compiler.models.flops import days_for_tokens, flops_breakdown, hardware_flops_per_token, mfu
from lmspec.compiler.models.params import ParamCounts
from lmspec.compiler.models.serve_memory import ServeMemory
from lmspec.compiler.models.steptime import StepTime
from lmspec.compiler.models.train_memory import DEVICE_RESERVE_GIB, FRAGMENTATION_FRACTION, TERMS, TrainMemory
from lmspec.compiler.models.units import TFLOPS
from lmspec.compiler.spec.sections import TrainingSpec

MFU_POINTS = (0.6, 0.5, 0.4, 0.3)  # the step times shown are those that would reach these MFUs
TRILLION = 1e12
SIGNIFICANT = 6


@dataclass(frozen=True, kw_only=True)
class FlopsSummary:
    per_token: float  # model FLOPs (forward + backward)
    hardware_per_token: float  # plus recomputed forward work
    per_step: float
    peak_tflops_per_gpu: float
    n_gpus: int
    tokens_per_step: int

    @property
    def ideal_step_time_s(self) -> float:
        """Step time at 100% MFU: measured step time x MFU equals this."""
        return self.per_step / (self.n_gpus * self.peak_tflops_per_gpu * TFLOPS)

    def at(self, step_time_s: float) -> dict[str, float]:
        tokens_per_s = self.tokens_per_step / step_time_s
        return {
            "step_time_s": _round(step_time_s),
            "tokens_per_s": _round(tokens_per_s),
            "mfu": _round(mfu(tokens_per_s, self.per_token, self.n_gpus, self.peak_tflops_per_gpu)),
            "hfu": _round(mfu(tokens_per_s, self.hardware_per_token, self.n_gpus, self.peak_tflops_per_gpu)),
            "days_per_trillion_tokens": _round(days_for_tokens(TRILLION, tokens_per_s)),
        }


def flops_summary(spec: TrainingSpec, tokens_per_step: int, n_gpus: int) -> FlopsSummary:
    per_token = flops_breakdown(spec.model, spec.train.seq_length).total
    return FlopsSummary(
        per_token=per_token,
        hardware_per_token=hardware_flops_per_token(spec.model, spec.train.seq_length, spec.train.recompute),
        per_step=per_token * tokens_per_step,
        peak_tflops_per_gpu=spec.hardware.gpu.bf16_tflops,
        n_gpus=n_gpus,
        tokens_per_step=tokens_per_step,
    )


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT}g}")


def params_dict(p: ParamCounts) -> dict[str, Any]:
    return {
        "total": p.total,
        "active": p.active,
        "mtp": p.mtp,
        "largest_layer": p.largest_layer,
        "components": {
            k: v
            for k, v in p.as_dict().items()
            if k not in ("total", "active", "mtp", "mtp_replicated", "mtp_expert", "largest_layer", "expert")
        },
    }


def memory_dict(m: TrainMemory) -> dict[str, Any]:
    def stage(s: Any) -> dict[str, Any]:
        return {
            "stage": s.stage,
            "layers": s.layers,
            "dense_params": s.dense_params,
            "expert_params": s.expert_params,
            "in_flight_micro_batches": _round(s.in_flight),
            **{f"{t}_bytes": v for t, v in s.terms().items()},
            "allocated_bytes": s.allocated_bytes,
            "total_bytes": s.total_bytes,
            "host_bytes": s.host_bytes,
        }

    worst = m.worst
    return {
        "per_gpu": {f"{t}_bytes": v for t, v in worst.terms().items()},
        # what max_memory_allocated would report at the worst stage's peak; total_bytes adds the allocator's reserve
        "allocated_bytes": worst.allocated_bytes,
        "total_bytes": worst.total_bytes,
        "worst_stage": worst.stage,
        "budget_bytes": m.budget_bytes,
        "fits": m.fits,
        "device_reserve_gib": DEVICE_RESERVE_GIB,
        "fragmentation_fraction": FRAGMENTATION_FRACTION,
        "terms": list(TERMS),
        "stages": [stage(s) for s in m.stages],
    }


def flops_dict(f: FlopsSummary) -> dict[str, Any]:
    return {
        "per_token": _round(f.per_token),
        "hardware_per_token": _round(f.hardware_per_token),
        "per_step": _round(f.per_step),
        "peak_tflops_per_gpu": f.peak_tflops_per_gpu,
        "n_gpus": f.n_gpus,
        "ideal_step_time_s": _round(f.ideal_step_time_s),
        "mfu_at": [f.at(f.ideal_step_time_s / point) for point in MFU_POINTS],
    }


def serve_dict(s: ServeMemory) -> dict[str, Any]:
    return dict(s.__dict__)


def comm_dict(c: CommEstimate, step: StepTime) -> dict[str, Any]:
    """plan.json's `comm`: each dimension's communication with nothing overlapped beside the compute, and
    what the step leaves exposed after parallel.overlap (the number the communication warning weighs)."""
    return {
        "tp_s": _round(c.tp_s),
        "dp_s": _round(c.dp_s),
        "ep_s": _round(c.ep_s),
        "pp_s": _round(c.pp_s),
        "cp_s": _round(c.cp_s),
        "total_s": _round(c.total_s),
        "compute_s": _round(c.compute_s),
        "ratio_to_compute": _round(c.ratio_to_compute),
        "share_of_step": _round(c.share_of_step),
        "exposed_s": _round(float(step.comm)),
        "exposed_ratio_to_compute": _round(float(exposed_comm_ratio(step))),
        "warning_ratio": COMM_SHARE_WARNING,
    }


def exposed_comm_ratio(t: StepTime) -> Any:
    """The communication the step leaves exposed (StepTime.comm: the tp, ep, cp, pp and dp terms, after what
    parallel.overlap hides) over its compute: what the communication warning weighs against
    COMM_SHARE_WARNING (rules/budget.py) and `lmspec plan` ranks by. Plain arithmetic, floats or arrays."""
    return t.comm / t.compute


def comm_over_warning(t: StepTime) -> Any:
    """Where the communication warning fires: exposed communication above COMM_SHARE_WARNING of compute.
    One condition for the rule (rules/budget.communication_within_budget) and the search
    (compiler/search/search.py ranks such layouts below every other); plain arithmetic, floats or arrays."""
    return t.comm > COMM_SHARE_WARNING * t.compute


def checkpoint_dict(c: CheckpointSize) -> dict[str, Any]:
    """plan.json's `checkpoint`: one save's bytes, the part that stops training (exposed_s) and the part that
    runs beside it (overlapped_s: the persist, when train.checkpoint.async_save)."""
    return {
        "params": c.params,
        "bytes_per_param": c.bytes_per_param,
        "bytes_per_save": c.bytes_per_save,
        "saves_kept": c.saves_kept,
        "kept_bytes": c.kept_bytes,
        "peak_bytes": c.peak_bytes,
        "async_save": c.async_save,
        "bytes_per_rank": _round(c.bytes_per_rank),
        "host_bytes_per_node": c.host_bytes_per_node,
        "host_memory_bytes": c.host_memory_bytes,
        "staging_s": _round(c.staging_s),
        "write_s": _round(c.write_s),
        "digest_s": _round(c.digest_s),
        "persist_s": _round(c.persist_s),
        "exposed_s": _round(c.exposed_s),
        "overlapped_s": _round(c.overlapped_s),
        "timeout_s": c.timeout_s,
    }


def cadence_dict(c: CheckpointCadence) -> dict[str, Any]:
    """plan.json's `checkpoint_cadence`: the saves at the estimated step time and the Young/Daly interval."""
    return {
        "step_s": _round(c.step_s),
        "interval_steps": c.interval_steps,
        "interval_s": _round(c.interval_s),
        "wait_s": _round(c.wait_s),
        "exposed_per_save_s": _round(c.exposed_per_save_s),
        "job_mtbf_s": _round(c.job_mtbf_s),
        "young_interval_s": _round(c.young_interval_s),
        "advised_interval_s": _round(c.advised_interval_s),
        "advice": c.advice,
        "advised_interval_steps": c.advised_interval_steps,
        "lost_share": _round(c.lost_share),
        "advised_lost_share": _round(c.advised_lost_share),
    }


STEP_TERMS = ("compute", "tp_comm", "ep_comm", "cp_comm", "pp_comm", "bubble", "dp_comm", "optimizer")


@dataclass(frozen=True, kw_only=True)
class StepEstimate:
    """The one estimated step time of a training layout (`estimate_step_time`, the step time `lmspec plan`
    ranks layouts by and `lmspec explain` prints) and the throughput it implies."""

    step_time_s: float
    tokens_per_s: float
    tokens_per_s_per_gpu: float
    mfu: float  # against the bf16 peak, as FlopsSummary's points
    hfu: float  # the same with recomputed work counted
    days_per_trillion_tokens: float
    terms_s: dict[str, float]  # STEP_TERMS -> seconds per step; they sum to step_time_s


def throughput_dict(e: StepEstimate) -> dict[str, Any]:
    """The one estimated step (overlap included, as `lmspec plan` prices the layout) and its terms, for
    `lmspec explain`; the terms sum to step_time_s."""
    return {
        "step_time_s": _round(e.step_time_s),
        "tokens_per_s": _round(e.tokens_per_s),
        "tokens_per_s_per_gpu": _round(e.tokens_per_s_per_gpu),
        "mfu": _round(e.mfu),
        "hfu": _round(e.hfu),
        "terms": {f"{k}_s": _round(v) for k, v in e.terms_s.items()},
    }


def step_estimate(f: FlopsSummary, t: StepTime) -> StepEstimate:
    tokens_per_s = f.tokens_per_step / t.total
    return StepEstimate(
        step_time_s=t.total,
        tokens_per_s=tokens_per_s,
        tokens_per_s_per_gpu=tokens_per_s / f.n_gpus,
        mfu=mfu(tokens_per_s, f.per_token, f.n_gpus, f.peak_tflops_per_gpu),
        hfu=mfu(tokens_per_s, f.hardware_per_token, f.n_gpus, f.peak_tflops_per_gpu),
        days_per_trillion_tokens=days_for_tokens(TRILLION, tokens_per_s),
        terms_s={k: float(getattr(t, k)) for k in STEP_TERMS},
    )
