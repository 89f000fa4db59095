"""torch.compile for a training step, CUDA graphs on a GPU.

On a GPU the eager step is limited by the host launching thousands of small kernels, not by the GPU's
arithmetic. Compiled, a part's small operators are fused into fewer kernels, launched without Python
and autograd bookkeeping per operator, and where shapes are fixed replayed as CUDA graphs
(`mode="reduce-overhead"`): one launch per graph. The alignment search, the losses and the
spectrograms stay eager between them. What is compiled is a scope (SCOPES):

- "segments": SEGMENT_PARTS (the decoder on `segment_frames`-frame slices) and the discriminator
  ([real; fake] slices of `segment_size` samples), whose shapes depend only on the micro-batch size:
  static (`dynamic=False`) and CUDA graphs; a new micro-batch size (an epoch's short last step, an
  out-of-memory retry) compiles its own graph rather than a slower dynamic one.
- "fused": also UTTERANCE_PARTS (text encoder, posterior encoder, flow, duration predictor), which see
  each batch's padded text and frame lengths: compiled once with symbolic shapes (`dynamic=True`),
  fused kernels without CUDA graphs (a graph would be recorded, and its memory held, per shape).
  Each is LengthChecked: a part that new lengths compile again goes back to eager.
- "graphs": as "fused", with CUDA graphs for the utterance parts too: compiled once with symbolic
  lengths, then graphs recorded for each path of padded shapes a micro-step takes (CUDA graph trees:
  the graphs one micro-step runs, in order, under one memory pool; a part's shape met after other
  shapes of the parts before it is a new path), replayed when the path comes again. A new path runs
  once to warm up, is recorded the next time, and replays from the third (WARMUP_AND_RECORD):
  data/shapes.py ties the token width to the frame width, so a run meets about one path per frame
  edge.

On an H100 (MMS size, micro-batch 32, bf16) a step took 0.260 s eager, 0.221 s with "segments" and
0.084 s with "graphs" (docs/performance.md); "fused" was no faster than "segments". The trainer
(compile_choice.py) compiles "graphs" and measures it, then "segments" from the same compiled parts,
and keeps the faster, or eager. Two torch 2.13 behaviours would make the utterance parts compile
again for every new length, and are changed here once per process: keep_conv1d_backward_dynamic and
keep_saved_strides_symbolic. `python bench/bench_compile.py --scopes segments,fused,graphs` measures
the three.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import torch

# transformers' text encoder asks an lru_cache'd function whether torch.distributed is available;
# Dynamo traces the function itself and warns of a "potential risk" that does not apply to it
warnings.filterwarnings("ignore", message="Dynamo detected a call to a `functools.lru_cache`-wrapped")
# inductor tells of a softmax it splits (the text encoder's attention on an H100) and asks for a PyTorch
# issue; the kernel it makes instead is correct, and the run's user can do nothing about it
warnings.filterwarnings("ignore", message=r"\s*Online softmax is disabled on the fly")

BACKEND = "inductor"  # torch's default compiler; the CPU tests use "aot_eager" (capture without codegen)
SEGMENT_PARTS = ("decoder",)
UTTERANCE_PARTS = ("text_encoder", "posterior_encoder", "flow", "duration_predictor")
SCOPES = ("segments", "fused", "graphs")
SCOPE = "segments"  # GanStep.use_compiled's default
TRIED = ("graphs", "segments")  # what the trainer measures (compile_choice.py), widest first


CACHE_FOLDER = "compile_cache"  # in the checkpoint folder: the run's compiled code, kept for its resumes
CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"  # inductor's on-disk cache (its Triton kernels go inside it)
_pointed: set[str] = set()  # the folders this process pointed the cache at (not the user's choice)


def keep_compiled_code(folder: Path) -> tuple[str, bool]:
    """Point torch.compile's on-disk cache (compiled graphs, their autograd, Triton kernels, autotuning
    results) at `folder`, unless the user chose one with TORCHINDUCTOR_CACHE_DIR. Its default lives in
    the temporary folder, which a new Kaggle or Colab session starts without: a run resumed there would
    compile everything again. In the checkpoint folder it travels with the checkpoints, and a resume
    reuses what matches its torch, GPU and shapes. Returns (the folder used, whether it is the user's)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    current = os.environ.get(CACHE_VARIABLE)
    # inductor writes its default into the variable on first use: that is no choice of the user's
    users = (
        current
        and current not in _pointed
        and os.path.abspath(current) != os.path.abspath(default_cache_dir())
    )
    if users:
        return current, True
    chosen = str(Path(folder).resolve())
    os.environ[CACHE_VARIABLE] = chosen
    _pointed.add(chosen)
    return chosen, False


def cached_graphs() -> tuple[int, int]:
    """(graphs inductor read back from its on-disk cache, graphs it compiled afresh) in this process."""
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]


def graphs_between(start: tuple[int, int], end: tuple[int, int]) -> tuple[int, int]:
    """(read back from the cache, compiled afresh) between two `cached_graphs()` readings."""
    return end[0] - start[0], end[1] - start[1]


def compile_mode(device_type: str, graphs: bool = True) -> str:
    """CUDA graphs where there is a GPU (and `graphs`); plain kernel fusion elsewhere."""
    return "reduce-overhead" if device_type == "cuda" and graphs else "default"


def compiled(module: torch.nn.Module, device_type: str, backend: str | None = None):
    """`module` compiled for fixed shapes (CUDA graphs on a GPU). The returned wrapper is an
    `nn.Module`: keep it out of other modules' attributes, or it is registered (and saved) as their
    submodule."""
    backend = backend or BACKEND
    mode = compile_mode(device_type) if backend == "inductor" else None
    return torch.compile(module, backend=backend, mode=mode, dynamic=False)


def keep_conv1d_backward_dynamic() -> None:
    """Make inductor lower a 1-D convolution's backward without fixing its length.

    Since torch 2.13 inductor lowers `convolution_backward` through a function that, before choosing
    a kernel, guards the strides of the input gradient to integers: a 1-D convolution's length becomes
    a constant and every new length compiles the part again (`tests/test_compile.py`). For a 1-D
    convolution that function always ends in the ATen kernel (its Triton templates are 2-D only), so
    calling that kernel directly, as its own fallback does, gives the same code without the guard. 2-D
    convolutions (the discriminator, fixed shapes) keep torch's lowering. Once per process; a torch
    without that lowering is left as it is."""
    try:
        from torch._inductor import lowering
        from torch._inductor.kernel import conv
    except ImportError:
        return
    op = torch.ops.aten.convolution_backward.default
    original = lowering.lowerings.get(op)
    fallback = getattr(conv, "aten_convolution_backward_fallback", None)
    if original is None or fallback is None or getattr(original, "keeps_conv1d_dynamic", False):
        return

    def lower(grad_out, input, weight, *args, **kwargs):
        chosen = fallback if len(weight.get_size()) == 3 else original
        return chosen(grad_out, input, weight, *args, **kwargs)

    lower.keeps_conv1d_dynamic = True
    lowering.lowerings[op] = lower


def keep_saved_strides_symbolic() -> None:
    """Make AOTAutograd compile a backward for symbolic lengths when inductor lays out a saved
    activation differently from eager.

    AOTAutograd compiles the backward with fake tensors laid out as eager lays them out; where
    inductor's forward chose another layout for a tensor it saves (the text encoder's relative
    position scores, the softmax statistics of the duration predictor's spline) it restrides the fake
    tensor to the forward's strides, but to their values for the first batch's lengths (torch 2.13,
    `set_tracing_context_output_strides`): either the length becomes a constant there (every new length
    compiles the part again) or, where no guard was recorded, the backward asserts the first batch's
    strides and fails on the next length ("expected ... stride 111==159"). Handing it inductor's
    stride expressions instead keeps them symbolic. Once per process; a torch without that function is
    left as it is."""
    try:
        from torch._inductor import output_code
        from torch._inductor.utils import shape_env_from_inputs
    except ImportError:
        return
    original = getattr(output_code, "set_tracing_context_output_strides", None)
    if original is None or getattr(original, "keeps_strides_symbolic", False):
        return

    def report(example_inputs, compiled_graph) -> None:
        context = torch._guards.TracingContext.try_get()
        shape_env = shape_env_from_inputs(example_inputs)
        strides = getattr(compiled_graph, "output_strides", None)
        if context is None or context.output_strides is None or shape_env is None or strides is None:
            return original(example_inputs, compiled_graph)

        def value(expr):
            try:
                return int(expr)
            except (TypeError, ValueError):
                return shape_env.deserialize_symexpr(expr)

        for exprs in strides:
            context.output_strides.append(None if exprs is None else tuple(value(e) for e in exprs))

    report.keeps_strides_symbolic = True
    output_code.set_tracing_context_output_strides = report


# CUDA graph trees run a new path of graphs once eagerly (warm-up), record it the next time and replay
# it from the third: the first two micro-steps on a path are slower than eager ones. (A new path made
# only of graphs warmed up before is recorded at once: its second step, a replay, is counted too.)
WARMUP_AND_RECORD = 2


class LengthChecked:
    """An utterance part compiled for every length, which goes back to eager when new lengths compile
    it again: some operators make torch fix a symbolic length to the batch's (a torch release's
    lowering, a module's code), and then each new length would cost a compilation (seconds to
    minutes) while the loop takes it for a step. A compilation on lengths seen before does not count.

    With symbolic shapes, Dynamo also makes every float attribute of the modules a symbolic input
    (dropout rates, the attention's scaling, the layer drop rate), then meets operators that need them
    as numbers and traces the whole part a second time with them fixed (docs/performance.md, "The
    compiled step"). They are constants, so Dynamo is told to fix them from the start."""

    RECOMPILES = 2  # compilations on new lengths tolerated after the first call
    recorded = 0  # calls that warmed up or recorded CUDA graphs, by every instance in this process
    path: tuple = ()  # this micro-step's (part, shape) calls so far under CUDA graphs (mark_step_begin)
    paths: dict[tuple, int] = {}  # how often each path (prefix) was taken in this process
    made = 0  # instances made in this process: each one's number keys its calls in a path

    def __init__(self, name: str, module, device_type: str, backend: str | None, graphs: bool, log):
        self.name, self.module, self.log = name, module, log
        LengthChecked.made += 1
        self.number = LengthChecked.made  # not id(): a later part could reuse a collected one's
        self.graphs = 0  # graphs Dynamo handed to the backend
        # a new path of shapes warms up, then records CUDA graphs (the steps meeting it are slower)
        self.records_graphs = (backend or BACKEND) == "inductor" and (
            compile_mode(device_type, graphs) == "reduce-overhead"
        )
        self.recompiles = 0
        self.shapes: set[tuple] = set()
        self.eager_reason: str | None = None
        self.compiled = torch.compile(
            module, backend=self._counting(backend, device_type, graphs), dynamic=True
        )

    def _counting(self, backend: str | None, device_type: str, graphs: bool):
        from torch._dynamo.backends.registry import lookup_backend

        backend = backend or BACKEND
        inner = lookup_backend(backend)
        if backend == "inductor" and compile_mode(device_type, graphs) == "reduce-overhead":
            from torch._inductor.compile_fx import compile_fx

            def inner(gm, example_inputs):
                return compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": True})

        def count(gm, example_inputs):
            self.graphs += 1
            return inner(gm, example_inputs)

        return count

    def __call__(self, *args, **kwargs):
        if self.eager_reason is not None:
            return self.module(*args, **kwargs)
        shape = tuple(tuple(a.shape) for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
        before, new_shape = self.graphs, shape not in self.shapes
        self.shapes.add(shape)
        with torch._dynamo.config.patch(specialize_float=True):  # the modules' floats are constants
            out = self.compiled(*args, **kwargs)
        if self.records_graphs:
            self._follow_path(shape)
        if new_shape and len(self.shapes) > 1 and self.graphs > before:
            self.recompiles += 1
            if self.recompiles > self.RECOMPILES:
                self.eager_reason = f"new lengths compiled it again {self.recompiles} times"
                self.log(f"compile: the {self.name.replace('_', ' ')} runs eager: {self.eager_reason}")
        return out

    def _follow_path(self, shape: tuple) -> None:
        """Count this call as recording when its path (this micro-step's calls up to here) was taken
        fewer than WARMUP_AND_RECORD times before: a shape seen before, but after other shapes of the
        parts before it, is a new path for CUDA graph trees."""
        path = (*LengthChecked.path, (self.number, shape))
        LengthChecked.path = path
        seen = LengthChecked.paths.get(path, 0) + 1
        LengthChecked.paths[path] = seen
        if seen <= WARMUP_AND_RECORD:
            LengthChecked.recorded += 1


def compiled_parts(
    model: torch.nn.Module,
    device_type: str,
    backend: str | None = None,
    scope: str = SCOPE,
    log=print,
    made: dict | None = None,
) -> dict:
    """The parts of a `VitsModel` that `scope` compiles, compiled, by attribute name (`log`: where a
    part that goes back to eager says so). `made`: parts compiled before for other scopes, taken from
    and added to, so that going from one scope to another compiles only what the first lacked."""
    if scope not in SCOPES:
        raise ValueError(f"unknown compile scope {scope!r}: choose from {', '.join(SCOPES)}")
    made = {} if made is None else made
    parts = {}
    for name in SEGMENT_PARTS:
        if name not in made:
            made[name] = compiled(getattr(model, name), device_type, backend)
        parts[name] = made[name]
    if scope != "segments":
        keep_conv1d_backward_dynamic()
        keep_saved_strides_symbolic()
        graphs = scope == "graphs"
        if graphs:
            # inductor warns past 8 shapes per graph and advises padding to a few: the batches are
            # padded to bucket edges already (data/shapes.py), and the user can do nothing about it
            import torch._inductor.config as inductor_config

            if hasattr(inductor_config.triton, "cudagraph_dynamic_shape_warn_limit"):
                inductor_config.triton.cudagraph_dynamic_shape_warn_limit = None
        for name in UTTERANCE_PARTS:
            key = f"{name} ({scope})"
            if key not in made:
                made[key] = LengthChecked(name, getattr(model, name), device_type, backend, graphs, log)
            parts[name] = made[key]
    return parts


def describe(scope: str) -> str:
    """What a scope compiles, for the log: "the decoder and discriminator passes", ..."""
    names = (*(UTTERANCE_PARTS if scope != "segments" else ()), *SEGMENT_PARTS)
    return f"the {', '.join(name.replace('_', ' ') for name in names)} and discriminator passes"


def compilations() -> int:
    """Graphs torch.compile has compiled in this process (each compilation and recompilation), and calls
    of an utterance part that warmed up or recorded CUDA graphs for a new path of shapes ("graphs"):
    each makes the step meeting it slower."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"] + LengthChecked.recorded


def mark_step_begin(device_type: str) -> None:
    """Tell CUDA graphs a new step begins: the outputs of the previous one may be overwritten, and the
    utterance parts' calls start a new path."""
    LengthChecked.path = ()
    if device_type == "cuda":
        torch.compiler.cudagraph_mark_step_begin()
