"""Operators dispatched per training step: a launch-overhead figure any machine can measure (not a test).

    python bench/bench_ops.py [--models tiny,mms] [--batch_size 8] [--label before|after] [--top 25]
    python bench/bench_ops.py --device cuda --models mms --batch_size 16 --precision bf16 --label gpu

On a GPU every operator is at least one kernel launch, so the number of operators the host dispatches
per step bounds how launch-bound a step is; on any machine it is exact and repeatable, where times
are noisy. For each model ("tiny": `vits_trainer.model.tiny` with a 0.125-wide discriminator; "mms":
transformers' default `VitsConfig`, the MMS size, with a full-width discriminator, as in
bench/bench_step.py) a session is built as train_vits.py builds it (fp32, CPU), and one micro-step of
the trainer's `GanStep` on a fixed batch of `--batch_size` generated clips (~3 s) is profiled with
`torch.profiler`, after one unprofiled step on the same batch (so AdamW's state exists and the
profiled step is a steady-state one).

Counted: "top-level" aten operators, i.e. aten events with no aten event above them. These are what
Python and the autograd engine dispatch; an operator's own sub-operators (aten::linear -> addmm) are
not counted again. Forward+backward (the two passes of the discriminator and generator blocks, losses
included) and the optimiser step (clipping, finiteness check, both AdamW steps) are reported apart.
Also reported: all aten events (nested ones included) and the number of distinct operator names.

Where the operators are: the forward ones are attributed to the innermost labelled region (the
generator's parts, the step's sections and its loss functions); each backward operator to the region
whose forward operator created its autograd node (matched by sequence number).

On a GPU (`--device cuda`) the same micro-step is also profiled on the device's side: the kernels
(copies and fills included) each region launches and their GPU time, the most expensive kernels, and
the GPU's busy time (the union of its activity intervals) against the wall time of the same micro-step
unprofiled (median of `--timed` steps, the GPU synchronised around each): the share of the step the
GPU computes. Far below 100 %, the host's launches limit the step; near it, the GPU's arithmetic does.

The operator counts are exact: two runs on the same code give the same numbers. Results go to
bench/results/ops.json under `--label` (the other labels' results are kept), with the step's losses,
so an "after" run can be checked against "before" (same losses within float tolerance).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.autograd import DeviceType  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

import vits_trainer.training.step as step_module  # noqa: E402
from bench.bench_step import (  # noqa: E402
    CORPUS_WORDS,
    batches_of,
    make_model_dir,
    quiet_session,
    train_config,
)
from vits_trainer.data.loader import (  # noqa: E402
    ClipDataset,
    collate_batch,
    move_batch,  # noqa: E402
)
from vits_trainer.data.synthetic import make_corpus  # noqa: E402
from vits_trainer.training.loop import gan_step  # noqa: E402
from vits_trainer.training.runtime import quiet_transformers  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "ops.json"
PREFIX = "ops:"  # marks this benchmark's own labelled regions among the profiler's events
GENERATOR_PARTS = (
    "text_encoder",
    "posterior_encoder",
    "flow",
    "duration_predictor",
    "decoder",
    "embed_speaker",
)
# the loss functions the step calls, labelled where step.py looks them up
STEP_LOSSES = ("discriminator_loss", "generator_adversarial_loss", "feature_matching_loss", "generator_total")


class RegionTimer:
    """Stands in for the step's SectionTimer: each section becomes a labelled profiler region."""

    def __call__(self, name: str):
        return record_function(f"{PREFIX}{name}")


def label_modules(modules: dict[str, torch.nn.Module], region=None) -> list:
    """Forward hooks that open a region around each module's forward: a labelled profiler region, or
    the context manager `region(name)` gives; returns the handles."""
    handles, stack = [], []
    region = region or (lambda name: record_function(f"{PREFIX}{name}"))

    def pre(name):
        def hook(module, args):
            opened = region(name)
            opened.__enter__()
            stack.append(opened)

        return hook

    def post(module, args, output):
        stack.pop().__exit__(None, None, None)

    for name, module in modules.items():
        handles.append(module.register_forward_pre_hook(pre(name)))
        handles.append(module.register_forward_hook(post))
    return handles


@contextlib.contextmanager
def labelled_losses():
    """The step's loss functions wrapped in labelled regions (same functions, same results)."""
    originals = {name: getattr(step_module, name) for name in STEP_LOSSES}

    def wrap(name, fn):
        def wrapped(*args, **kwargs):
            with record_function(f"{PREFIX}loss.{name}"):
                return fn(*args, **kwargs)

        return wrapped

    for name, fn in originals.items():
        setattr(step_module, name, wrap(name, fn))
    try:
        yield
    finally:
        for name, fn in originals.items():
            setattr(step_module, name, fn)


def ancestor(event, prefix: str):
    """The innermost profiler event around `event` whose name starts with `prefix` (None if none)."""
    parent = event.cpu_parent
    while parent is not None and not parent.name.startswith(prefix):
        parent = parent.cpu_parent
    return parent


def region_of(event) -> str | None:
    """The innermost labelled region around a profiler event (None outside every region)."""
    parent = ancestor(event, PREFIX)
    return None if parent is None else parent.name[len(PREFIX) :]


def has_aten_ancestor(event) -> bool:
    return ancestor(event, "aten::") is not None


def backward_node_of(event):
    """The autograd engine's `evaluate_function` event an operator runs under (None in a forward)."""
    return ancestor(event, "autograd::engine::evaluate_function")


def forward_regions(aten: list) -> dict[int, str]:
    """Autograd sequence number -> region of the forward operator that recorded that node."""
    found: dict[int, str] = {}
    for e in aten:  # nested ones too: aten::linear's aten::t records its own node
        if e.sequence_nr >= 0 and backward_node_of(e) is None:
            found.setdefault(e.sequence_nr, region_of(e) or "other")
    return found


def region_for(event, forward_region: dict[int, str]) -> str:
    """The region a profiled CPU event counts in: its labelled region, or for a backward operator the
    forward region that created its autograd node ("optimizer" for the optimiser step)."""
    region = region_of(event) or "other"
    if region == "optimizer":
        return region
    node = backward_node_of(event)
    if node is None:
        return region
    if "AccumulateGrad" in node.name:
        return "backward: accumulate grad"
    return "backward of " + forward_region.get(node.sequence_nr, "?")


def count_ops(events) -> dict:
    """Top-level aten operators of one profiled step, split into step / optimizer and by region."""
    events = list(events)
    aten = [e for e in events if e.name.startswith("aten::")]
    top = [e for e in aten if not has_aten_ancestor(e)]
    forward_region = forward_regions(aten)
    by_region: collections.Counter = collections.Counter()
    by_name: collections.Counter = collections.Counter()
    optimizer = 0
    for e in top:
        region = region_for(e, forward_region)
        if region == "optimizer":
            optimizer += 1
            continue
        by_region[region] += 1
        by_name[e.name] += 1
    opt_names = collections.Counter(e.name for e in top if region_of(e) == "optimizer")
    return {
        "forward_backward_ops": sum(by_region.values()),
        "optimizer_ops": optimizer,
        "all_aten_events": len(aten),
        "distinct_ops_forward_backward": len(by_name),
        "by_region": dict(by_region.most_common()),
        "by_op": dict(by_name.most_common()),
        "optimizer_by_op": dict(opt_names.most_common()),
    }


def union_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: time the device was doing something."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def device_work(events, cpu) -> list:
    """The device's own events: kernels, copies and fills. The profiler also puts each labelled region
    (`record_function`, and the optimiser's own) on the GPU's timeline as a span from its first kernel to
    its last, gaps included; counted as work, those spans made a step whose kernels ran 27 % of it read
    86 % busy (H100, MMS size). They carry the name of the CPU-side region they mirror."""
    regions = {e.name for e in cpu}
    return [e for e in events if e.device_type == DeviceType.CUDA and e.name not in regions]


def count_kernels(events) -> dict:
    """The device's side of one profiled step: its busy time, and the kernels (copies and fills
    included) each region launched with their GPU time, each kernel counted at the CPU event that
    launched it."""
    events = list(events)
    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    device = device_work(events, cpu)
    forward_region = forward_regions([e for e in cpu if e.name.startswith("aten::")])
    launches: collections.Counter = collections.Counter()
    gpu_us: collections.Counter = collections.Counter()
    by_kernel: collections.Counter = collections.Counter()
    for e in cpu:
        if not e.kernels:
            continue
        region = e.name[len(PREFIX) :] if e.name.startswith(PREFIX) else region_for(e, forward_region)
        launches[region] += len(e.kernels)
        gpu_us[region] += sum(k.duration for k in e.kernels)
    for e in device:
        by_kernel[e.name[:90]] += e.time_range.end - e.time_range.start
    return {
        "device_events": len(device),
        "kernels_attributed": sum(launches.values()),
        "runtime_launches": sum(1 for e in cpu if "Launch" in e.name or e.name.startswith("cudaMemcpy")),
        "gpu_busy_ms": union_us([(e.time_range.start, e.time_range.end) for e in device]) / 1e3,
        "gpu_kernel_ms": sum(e.time_range.end - e.time_range.start for e in device) / 1e3,
        "kernels_by_region": dict(launches.most_common()),
        "gpu_ms_by_region": {k: v / 1e3 for k, v in gpu_us.most_common()},
        "gpu_ms_by_kernel": {k: v / 1e3 for k, v in by_kernel.most_common(40)},
    }


def timed_steps(step, batch, n: int, device: torch.device) -> list[float]:
    """Wall seconds of `n` unprofiled micro-steps (each a whole optimiser step), the device synchronised
    around each."""
    times = []
    for _ in range(n):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        step(batch, 0, 1)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return times


def profile_step(
    kind: str,
    batch_size: int,
    tmp: Path,
    data_dir: Path,
    device: str = "cpu",
    precision: str = "no",
    timed: int = 5,
    channels_last: bool = False,
) -> dict:
    model_dir = make_model_dir(kind, tmp / f"model-{kind}")
    cfg = train_config(tmp / f"run-{kind}", data_dir, model_dir, kind, batch_size, device, precision)
    session = quiet_session(cfg)
    if channels_last:  # the period discriminators' 4-D weights (and so their convolutions) in NHWC
        session.discriminator_raw.to(memory_format=torch.channels_last)
    step = gan_step(session)
    generator = session.generator_raw
    indices = batches_of(session)[0]
    dataset = ClipDataset(session.data.train)
    batch = collate_batch([dataset[j] for j in indices])
    batch.pop("indices")
    batch.pop("text_lengths")
    batch = move_batch(batch, session.device)

    torch.manual_seed(1)
    step(batch, 0, 1)  # AdamW creates its state on its first step: profile a steady-state step
    on_gpu = session.device.type == "cuda"
    wall = timed_steps(step, batch, timed, session.device) if on_gpu else []
    modules = {f"generator.{name}": getattr(generator.model, name, None) for name in GENERATOR_PARTS}
    modules = {name: m for name, m in modules.items() if m is not None}
    handles = label_modules(modules)
    step.timer = generator.timer = RegionTimer()
    torch.manual_seed(2)
    try:
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
        with labelled_losses(), profile(activities=activities) as prof:
            result = step(batch, 0, 1)
            if on_gpu:
                torch.cuda.synchronize(session.device)
    finally:
        for h in handles:
            h.remove()
    if not result.synced or result.skipped:
        raise RuntimeError(f"{kind}: the profiled step did not update the networks")
    counts = count_ops(prof.events())
    if on_gpu:
        counts["gpu"] = count_kernels(prof.events())
        counts["gpu"]["step_s"] = statistics.median(wall)
        counts["gpu"]["step_s_each"] = wall
        counts["gpu"]["busy_share"] = counts["gpu"]["gpu_busy_ms"] / 1e3 / statistics.median(wall)
        counts["gpu"]["peak_gb"] = torch.cuda.max_memory_allocated(session.device) / 1e9
    losses = {k: float(v) for k, v in result.metrics.items()}
    return {
        "model": kind,
        "device": str(session.device),
        "precision": precision,
        "batch_size": batch_size,
        "channels_last": channels_last,
        "audio_samples": int(batch["audio"].shape[-1]),
        "tokens": int(batch["input_ids"].shape[-1]),
        "params_generator_m": sum(p.numel() for p in generator.parameters()) / 1e6,
        "params_discriminator_m": sum(p.numel() for p in session.discriminator_raw.parameters()) / 1e6,
        "losses": losses,
        **counts,
    }


def compare_losses(before: dict, after: dict, rtol: float) -> list[str]:
    """Loss keys whose values differ by more than rtol (relative) between two runs."""
    bad = []
    for key, b in before.items():
        a = after.get(key)
        if a is None or not math.isclose(a, b, rel_tol=rtol, abs_tol=1e-6):
            bad.append(f"{key}: before {b:.6g}, now {a}")
    return bad


def print_rows(title: str, lines, top: int) -> None:
    """A titled breakdown: its first `top` lines, indented under the title."""
    print(f"  {title}:")
    for line in list(lines)[:top]:
        print(f"    {line}")


def print_run(run: dict, top: int) -> None:
    print(
        f"\n{run['model']} (batch {run['batch_size']}, {run['audio_samples']} samples, "
        f"{run['tokens']} tokens): {run['forward_backward_ops']} operators per forward+backward, "
        f"{run['optimizer_ops']} in the optimiser step; {run['all_aten_events']} aten events in all, "
        f"{run['distinct_ops_forward_backward']} distinct operators"
    )
    print_rows("by region", (f"{n:>6}  {region}" for region, n in run["by_region"].items()), top)
    print_rows("most frequent operators", (f"{n:>6}  {name}" for name, n in run["by_op"].items()), top)
    print(
        "  optimiser step: "
        + ", ".join(f"{n} {name}" for name, n in list(run["optimizer_by_op"].items())[:8])
    )
    gpu = run.get("gpu")
    if gpu:
        print(
            f"  on {run['device']} ({run['precision']}): step {gpu['step_s'] * 1e3:.1f} ms unprofiled "
            f"(median of {len(gpu['step_s_each'])}, {run['batch_size'] / gpu['step_s']:.1f} samples/s), "
            f"GPU busy {gpu['gpu_busy_ms']:.1f} ms of it: {100 * gpu['busy_share']:.0f} %; "
            f"{gpu['kernels_attributed']} kernels ({gpu['device_events']} device events, "
            f"{gpu['runtime_launches']} launch calls), {gpu['gpu_kernel_ms']:.1f} ms of kernels; "
            f"peak {gpu['peak_gb']:.1f} GB"
        )
        regions = gpu["gpu_ms_by_region"].items()
        kernels = gpu["kernels_by_region"]
        print_rows(
            "kernels and GPU ms by region", (f"{kernels[r]:>6}  {ms:8.2f} ms  {r}" for r, ms in regions), top
        )
        print_rows(
            "GPU ms by kernel", (f"{ms:8.2f} ms  {name}" for name, ms in gpu["gpu_ms_by_kernel"].items()), top
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="tiny,mms", help="comma-separated: tiny, mms")
    parser.add_argument("--batch_size", type=int, default=8, help="the fixed micro-batch")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: also the kernels and GPU time")
    parser.add_argument("--precision", default="no", choices=["no", "fp16", "bf16"])
    parser.add_argument("--timed", type=int, default=5, help="unprofiled steps timed on a GPU")
    parser.add_argument(
        "--channels_last",
        action="store_true",
        help="the discriminator's 2-D convolutions in NHWC (on a GPU cuDNN converted NCHW for 21 %% of the "
        "kernel time)",
    )
    parser.add_argument("--label", default="after", help="key under which ops.json keeps these results")
    parser.add_argument("--top", type=int, default=25, help="rows shown per breakdown")
    parser.add_argument("--rtol", type=float, default=1e-4, help="loss tolerance against the 'before' run")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not set(models) <= {"tiny", "mms"}:
        parser.error(f"--models: {args.models!r} (tiny, mms)")

    quiet_transformers()
    torch.manual_seed(0)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_ops-") as tmp_name:
        tmp = Path(tmp_name)
        data_dir = tmp / "data"
        make_corpus(data_dir, num_clips=24, seed=0, min_words=CORPUS_WORDS[0], max_words=CORPUS_WORDS[1])
        for kind in models:
            print(f"{kind}: profiling one micro-step of batch {args.batch_size} ...", flush=True)
            runs.append(
                profile_step(
                    kind,
                    args.batch_size,
                    tmp,
                    data_dir,
                    args.device,
                    args.precision,
                    args.timed,
                    args.channels_last,
                )
            )
            print_run(runs[-1], args.top)

    results = json.loads(args.out.read_text(encoding="utf-8")) if args.out.is_file() else {}
    command = "python bench/bench_ops.py " + " ".join(argv if argv is not None else sys.argv[1:])
    entry = results.setdefault(args.label, {})
    entry.update({"command": command, "torch": torch.__version__})
    entry.setdefault("runs", {})
    for run in runs:
        entry["runs"][run["model"]] = run
    status = 0
    before = results.get("before", {}).get("runs", {})
    if args.label != "before" and before:
        print("\nagainst 'before':")
        for run in runs:
            ref = before.get(run["model"])
            same = ("batch_size", "device", "precision")
            defaults = {"device": "cpu", "precision": "no"}  # results from before these were recorded
            if ref is None or any(ref.get(k, defaults.get(k)) != run[k] for k in same):
                continue
            fb, opt = ref["forward_backward_ops"], ref["optimizer_ops"]
            print(
                f"  {run['model']}: forward+backward {fb} -> {run['forward_backward_ops']} "
                f"({fb / run['forward_backward_ops']:.2f}x fewer), optimiser {opt} -> {run['optimizer_ops']} "
                f"({opt / max(run['optimizer_ops'], 1):.2f}x fewer), whole step {fb + opt} -> "
                f"{run['forward_backward_ops'] + run['optimizer_ops']} "
                f"({(fb + opt) / (run['forward_backward_ops'] + run['optimizer_ops']):.2f}x fewer)"
            )
            bad = compare_losses(ref["losses"], run["losses"], args.rtol)
            if bad:
                status = 1
                print("  LOSSES DIFFER: " + "; ".join(bad))
            else:
                print(f"  losses match 'before' within rtol {args.rtol:g}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
