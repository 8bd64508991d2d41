"""What a compiled step does, read off its optimized HLO text: the collectives (kind, executions per step, bytes,
device groups) and the matmul FLOPs, with every computation counted as often as it runs (a ``while`` body
``known_trip_count`` times, e.g. the gradient-accumulation loop; fusions and calls as often as their caller).

XLA's own ``cost_analysis()`` counts a while body once, so a step with 64 microbatches would be reported as 1/64
of its FLOPs; this reader is what the dry run uses instead. Only the text format is relied on, not XLA's
Python bindings.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

import numpy as np

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
               "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) \((.*)\) -> .* \{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.*)$")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
NO_KERNEL = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all", "opt-barrier",
             "partition-id", "replica-id"}
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_CUBLAS_GEMM = re.compile(r'custom_call_target="__cublas\$(?:gemm|lt\$matmul)')
_CUBLAS_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')


@dataclasses.dataclass(frozen=True)
class Collective:
    """One collective instruction: ``bytes`` is the size of its operands on one device, ``count`` how many
    times a step runs it, ``groups`` the device ids that exchange data with each other."""

    kind: str
    bytes: int
    count: int
    groups: tuple[tuple[int, ...], ...]

    @property
    def group_size(self) -> int:
        return len(self.groups[0]) if self.groups else 1

    @property
    def wire_bytes(self) -> float:
        """Bytes each device sends per execution with ring/bucket algorithms (the standard cost model):
        all-reduce 2(n-1)/n of its data, all-gather (n-1) x its shard, reduce-scatter and all-to-all (n-1)/n,
        a permute its whole operand."""
        n = self.group_size
        if self.kind == "collective-permute":
            return float(self.bytes)
        if n <= 1:
            return 0.0
        factor = {"all-reduce": 2 * (n - 1) / n, "all-gather": n - 1.0, "reduce-scatter": (n - 1) / n,
                  "all-to-all": (n - 1) / n}[self.kind]
        return factor * self.bytes


@dataclasses.dataclass(frozen=True)
class HloStats:
    collectives: tuple[Collective, ...]
    matmul_flops: float  # per device per step: 2 x output elements x contracted elements of every dot,
    # convolution (the TPU compiler's dots) and cuBLAS call (the GPU compiler's dots it hands to the library)
    whole_before_scatter: int = 0  # bytes the CPU program holds whole before slicing (see _scattered_bytes)
    attention_kernel_calls: int = 0  # per step: attention kernels whose FLOPs are not in matmul_flops (splash's
    # Pallas kernels on TPUs, cuDNN's flash attention on GPUs)

    def by_kind(self) -> dict[str, dict]:
        """{kind: {"ops", "executions", "bytes", "wire_bytes"}} summed over the step, per device."""
        table: dict[str, dict] = {}
        for c in self.collectives:
            row = table.setdefault(c.kind, {"ops": 0, "executions": 0, "bytes": 0.0, "wire_bytes": 0.0})
            row["ops"] += 1
            row["executions"] += c.count
            row["bytes"] += c.bytes * c.count
            row["wire_bytes"] += c.wire_bytes * c.count
        return table


def array_bytes(shape_text: str) -> int:
    """Bytes of every array in an HLO shape (a tuple shape sums its elements)."""
    return sum(DTYPE_BYTES.get(dtype, 4) * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in _ARRAY.findall(shape_text))


def _dims(shape_text: str) -> list[int]:
    match = _ARRAY.search(shape_text)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


def _split_shape(rest: str) -> tuple[str, str]:
    """``"(f32[2], f32[3]) all-reduce(...)"`` -> (shape, ``"all-reduce(...)"``)."""
    if rest.startswith("("):
        depth = 0
        for i, ch in enumerate(rest):
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth == 0:
                return rest[:i + 1], rest[i + 1:].lstrip()
    shape, _, tail = rest.partition(" ")
    return shape, tail


def _arguments(call: str) -> tuple[list[str], str]:
    """``"op(%a, %b), attrs"`` -> (["%a", "%b"], "attrs")."""
    start = call.index("(")
    depth = 0
    for i in range(start, len(call)):
        depth += {"(": 1, ")": -1, "{": 1, "}": -1}.get(call[i], 0)
        if depth == 0:
            inner = call[start + 1:i]
            return [a.strip() for a in inner.split(",") if a.strip()], call[i + 1:]
    return [], ""


def replica_groups(attrs: str, device_count: int) -> tuple[tuple[int, ...], ...]:
    """The device groups of a collective, from any of XLA's three spellings: explicit ``{{0,1},{2,3}}``, iota
    ``[2,4]<=[4,2]T(1,0)``, or mesh axes ``mesh['axis_0'=2,'axis_1'=4] {'axis_1'}``."""
    match = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", attrs)
    if match:
        axes = re.findall(r"'([^']+)'=(\d+)", match.group(1))
        names, sizes = [a for a, _ in axes], [int(s) for _, s in axes]
        grouped = [names.index(a) for a in re.findall(r"'([^']+)'", match.group(2))]
        ids = np.arange(math.prod(sizes)).reshape(sizes)
        order = [i for i in range(len(sizes)) if i not in grouped] + grouped
        size = math.prod(sizes[i] for i in grouped)
        return tuple(map(tuple, ids.transpose(order).reshape(-1, size).tolist()))
    match = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", attrs)
    if match:
        shape = [int(d) for d in match.group(1).split(",")]
        dims = [int(d) for d in match.group(2).split(",")]
        ids = np.arange(math.prod(dims)).reshape(dims)
        if match.group(3):
            ids = ids.transpose([int(d) for d in match.group(3).split(",")])
        return tuple(map(tuple, ids.reshape(shape[0], -1).tolist()))
    match = re.search(r"replica_groups=\{(\{[\d,{}\s]*\})\}", attrs)
    if match:
        return tuple(tuple(int(d) for d in g.split(",") if d) for g in re.findall(r"\{([\d,]*)\}", match.group(1)))
    return (tuple(range(device_count)),)  # no groups: every device


def source_target_pairs(attrs: str) -> tuple[tuple[int, ...], ...]:
    """A collective-permute's (source, target) device pairs."""
    match = re.search(r"source_target_pairs=\{(\{[\d,{}\s]*\})\}", attrs)
    return tuple(tuple(int(d) for d in p.split(",")) for p in re.findall(r"\{(\d+,\d+)\}", match.group(1))) \
        if match else ()


def _operand(arg: str) -> str:
    """``"%name"`` or ``"f32[2] %name"`` -> ``"name"``."""
    return arg.split(" ")[-1].lstrip("%")


def _scattered_bytes(result: str, shape: str, users: dict, n: int) -> int:
    """Bytes of an all-reduce's results of which every use keeps exactly 1/n (this device's slice, indexed by its
    partition id, often fused with what follows): a reduce-scatter that XLA's CPU pipeline leaves as all-reduce +
    dynamic-slice, where the GPU and TPU pipelines emit a reduce-scatter."""
    elements = [(result, shape)]
    if shape.startswith("("):
        elements = [(u[0], u[1]) for u in users[result] if u[2] == "get-tuple-element"]
    return sum(array_bytes(element_shape) for element, element_shape in elements
               if _kept_in_slices(element, _elements(element_shape), users, n))


def _elements(shape_text: str) -> int:
    return math.prod(_dims(shape_text))


def _kept_in_slices(name: str, elements: int, users: dict, n: int, depth: int = 2) -> bool:
    """Whether every use of ``name`` (an array of ``elements``) keeps 1/n of it: directly, or after up to ``depth``
    operations that keep it whole (a bf16 weight's f32 gradient sum converted to bf16 whole before its slice is
    added to the accumulated gradients)."""
    consumers = users[name]
    if not consumers:
        return False
    for consumer, shape, op, *_ in consumers:
        if op == "get-tuple-element" or shape.startswith("("):
            return False
        count = _elements(shape)
        if count * n == elements:
            continue
        if not (count == elements and depth and _kept_in_slices(consumer, count, users, n, depth - 1)):
            return False
    return True


def _window_pairs(in_size: int, out_size: int, size: int, stride: int, pad_low: int, lhs_dilation: int,
                  rhs_dilation: int) -> int:
    """How many (output position, window position) pairs of one spatial dimension read an input element rather
    than padding or a hole of the dilated input."""
    at = (np.arange(out_size)[:, None] * stride + np.arange(size)[None, :] * rhs_dilation - pad_low)
    return int(((at >= 0) & (at <= (in_size - 1) * lhs_dilation) & (at % lhs_dilation == 0)).sum())


def convolution_flops(shape: str, lhs: str, attrs: str) -> float:
    """2 x the multiply-adds of an HLO ``convolution`` that read real inputs. The TPU compiler writes every dot as
    a convolution, some with a padded window standing in for a contracted or batch dimension (``PD,DNH->PNH``
    becomes a window of 12 over a padded axis of 1), so only valid window positions count, as XLA's own cost
    analysis counts them."""
    labels = re.search(r"dim_labels=(\w+)_(\w+)->(\w+)", attrs)
    if labels is None:
        return 0.0
    lhs_labels, _, out_labels = labels.groups()
    lhs_dims, out_dims = _dims(lhs), _dims(shape)
    window = dict(re.findall(r"(\w+)=([\dx_\-]+)", (re.search(r"window=\{([^}]*)\}", attrs) or [None, ""])[1]))

    def per_dim(key: str, default: int) -> list[int]:  # "size=1x12" -> [1, 12]; "pad=0_0x11_11" -> low pads
        return [int(v.split("_")[0]) for v in window[key].split("x")] if key in window else [default] * 8

    sizes, strides, pads = per_dim("size", 1), per_dim("stride", 1), per_dim("pad", 0)
    lhs_dilations, rhs_dilations = per_dim("lhs_dilate", 1), per_dim("rhs_dilate", 1)
    groups = int((re.search(r"feature_group_count=(\d+)", attrs) or [None, 1])[1])
    macs = out_dims[out_labels.index("b")] * out_dims[out_labels.index("f")] * lhs_dims[lhs_labels.index("f")]
    macs //= groups
    spatial = sorted(c for c in lhs_labels if c.isdigit())
    for d, c in enumerate(spatial):
        macs *= _window_pairs(lhs_dims[lhs_labels.index(c)], out_dims[out_labels.index(c)], sizes[d], strides[d],
                              pads[d], lhs_dilations[d], rhs_dilations[d])
    return 2.0 * macs


def _int_constants(lines: list[str]) -> dict[str, int]:
    """{instruction name: value} of a computation's scalar integer constants (jax's loops count in s32, XLA's
    windowed collective matmuls in u32)."""
    return {name: int(value) for name, value in
            re.findall(r"%([\w.\-]+) = [su](?:32|64)\[\]\S* constant\((-?\d+)\)", "\n".join(lines))}


def _tuple_elements(lines: list[str], name: str | None = None) -> list[str] | None:
    """The operand names of the ``tuple`` instruction ``name`` (default: the computation's ROOT)."""
    for line in lines:
        match = _INSTRUCTION.match(line)
        if match and (match.group(1) == name if name else line.lstrip().startswith("ROOT ")):
            shape, call = _split_shape(match.group(2))
            return [_operand(a) for a in _arguments(call)[0]] if call.startswith("tuple(") else None
    return None


def _counter_step(body: list[str], index: int) -> int:
    """How much a loop body adds to the counter at tuple ``index``: jax's loops 1, a loop XLA unrolled twice
    (its ``wide.`` bodies) 2; 1 if the update is not ``counter + constant``."""
    elements = _tuple_elements(body)
    if not elements or index >= len(elements):
        return 1
    text = "\n".join(body)
    update = re.search(rf"%{re.escape(elements[index])} = \S+ add\(%([\w.\-]+), %([\w.\-]+)\)", text)
    constants = _int_constants(body)
    if update is None:
        return 1
    for counter, step in (update.groups(), update.groups()[::-1]):
        if step in constants and re.search(rf"%{re.escape(counter)} = \S+ get-tuple-element\(\S+\), "
                                           rf"index={index}\b", text):
            return max(constants[step], 1)
    return 1


def _counted_trips(line: str, caller: list[str], computations: dict[str, list[str]]) -> int:
    """The trip count of a ``while`` whose HLO does not state it (the TPU compiler's), read off its condition
    ``counter < N``, the counter's initial constant (0 if it is not a constant: jax's loops count from 0) and its
    step in the body (``_counter_step``); 1 for a loop of any other form."""
    loop = re.search(r" while\(%([\w.\-]+)\).*\bcondition=%([\w.\-]+), body=%([\w.\-]+)", line)
    if loop is None:
        return 1
    initial, cond, body = loop.group(1), computations.get(loop.group(2), []), computations.get(loop.group(3), [])
    root = next((c for c in cond if c.lstrip().startswith("ROOT ")), "")
    bound = re.search(r" compare\(%([\w.\-]+), %([\w.\-]+)\), direction=LT", root)
    if bound is None or bound.group(2) not in _int_constants(cond):
        return 1
    counter = re.search(rf"%{re.escape(bound.group(1))} = \S+ get-tuple-element\(\S+\), index=(\d+)",
                        "\n".join(cond))
    if counter is None:
        return 1
    index = int(counter.group(1))
    elements = _tuple_elements(caller, initial) or []
    start = _int_constants(caller).get(elements[index], 0) if index < len(elements) else 0
    return max(-(-(_int_constants(cond)[bound.group(2)] - start) // _counter_step(body, index)), 0)


def split_computations(text: str) -> tuple[dict[str, list[str]], dict[str, dict[str, str]], str]:
    """An optimized HLO module's text -> ({computation: its instruction lines}, {computation: {parameter: shape}},
    the ENTRY computation's name)."""
    computations: dict[str, list[str]] = {}
    params: dict[str, dict[str, str]] = {}
    entry, current = None, None
    for line in text.splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            computations[current] = []
            params[current] = dict(re.findall(r"([\w.\-]+): (\w+\[[\d,]*\])", header.group(2)))
            if line.startswith("ENTRY"):
                entry = current
        elif current is not None and line.strip() == "}":
            current = None
        elif current is not None:
            computations[current].append(line)
    if entry is None:
        raise ValueError("no ENTRY computation in the HLO text")
    return computations, params, entry


def loop_body_kernels(text: str) -> float:
    """How many operations one iteration of the module's largest ``while`` loop launches (a decode step of the
    generation loop): the top-level instructions of its body, less those that launch nothing (parameters, tuples,
    bitcasts, constants), over the iterations XLA unrolled into one body (GPU double buffering runs two). On a GPU
    each is a kernel (a fusion, a library call, a copy); 0 without a loop."""
    computations, _, _ = split_computations(text)
    counts = [0.0]
    for lines in computations.values():
        for line in lines:
            body = re.search(r"\bbody=%([\w.\-]+)", line)
            if body and body.group(1) in computations:
                unrolled = re.search(r'"known_init_step":\{"init":"-?\d+","step":"(\d+)"\}', line)
                kernels = sum(1 for body_line in computations[body.group(1)]
                              if (match := _INSTRUCTION.match(body_line))
                              and _split_shape(match.group(2))[1].split("(", 1)[0] not in NO_KERNEL)
                counts.append(kernels / int(unrolled.group(1)) if unrolled else kernels)
    return max(counts)


def parse_hlo(text: str, device_count: int) -> HloStats:
    """Collectives and matmul FLOPs of an optimized HLO module (``compiled.as_text()``), per device per step."""
    computations, params, entry = split_computations(text)

    # How often each computation runs per step: a while body trip-count times per run of its caller.
    calls: dict[str, list[tuple[str, int]]] = collections.defaultdict(list)
    for name, lines in computations.items():
        for line in lines:
            trips = _TRIP_COUNT.search(line)
            count = int(trips.group(1)) if trips else _counted_trips(line, lines, computations)
            for callee in _CALLED.findall(line):
                is_body = f"body=%{callee}" in line
                calls[name].append((callee, count if is_body else 1))
            for branches in _BRANCHES.findall(line):
                calls[name] += [(b.strip().lstrip("%"), 1) for b in branches.split(",") if b.strip()]
    runs: dict[str, int] = collections.defaultdict(int)

    def visit(name: str, times: int) -> None:
        runs[name] += times
        for callee, trips in calls.get(name, ()):
            visit(callee, times * trips)

    visit(entry, 1)

    found: list[Collective] = []
    flops = 0.0
    kernel_calls = 0
    scattered_once = 0
    for name, lines in computations.items():
        if not runs[name]:
            continue
        shapes = dict(params[name])
        parsed = []  # (instruction name, shape, op, arguments, attributes)
        for line in lines:
            match = _INSTRUCTION.match(line)
            if match:
                shape, call = _split_shape(match.group(2))
                shapes[match.group(1)] = shape
                parsed.append((match.group(1), shape, call.split("(", 1)[0], *_arguments(call)))
        users = collections.defaultdict(list)
        for instruction in parsed:
            for arg in instruction[3]:
                users[_operand(arg)].append(instruction)
        for result, shape, op, args, attrs in parsed:
            base = op.removesuffix("-start")
            if base in COLLECTIVES and not op.endswith("-done"):
                size = sum(array_bytes(shapes.get(_operand(a), a)) for a in args)
                groups = (source_target_pairs(attrs) if base == "collective-permute"
                          else replica_groups(attrs, device_count))
                scattered = _scattered_bytes(result, shape, users, len(groups[0])) if base == "all-reduce" else 0
                if scattered:
                    found.append(Collective("reduce-scatter", scattered, runs[name], groups))
                    scattered_once += scattered - scattered // len(groups[0])
                if size > scattered:
                    found.append(Collective(base, size - scattered, runs[name], groups))
            elif op == "dot" or op == "custom-call" and _CUBLAS_GEMM.search(attrs):
                # a dot states its contracted dimensions as an attribute, a cuBLAS call in its backend config
                lhs = _dims(shapes.get(_operand(args[0]), args[0]))
                contracting = (re.search(r"lhs_contracting_dims=\{([\d,]*)\}", attrs) if op == "dot"
                               else _CUBLAS_CONTRACTING.search(attrs))
                inner = math.prod(lhs[int(d)] for d in re.findall(r"\d+", contracting.group(1))) if contracting else 1
                flops += 2.0 * math.prod(_dims(shape)) * inner * runs[name]  # a cuBLAS call's first result
            elif op == "convolution":
                flops += convolution_flops(shape, shapes.get(_operand(args[0]), args[0]), attrs) * runs[name]
            elif op == "custom-call" and re.search(r'custom_call_target="(tpu_custom_call|__cudnn\$fmha)', attrs):
                kernel_calls += runs[name]
    return HloStats(tuple(found), flops, scattered_once, kernel_calls)
