"""The roofline of a compiled program's kernels, read from its optimized HLO.

XLA gives no cost analysis for a GPU program compiled without a GPU (``python -m
bert_jax.benchmark.aot ... --topology h100``), so the program is read: each instruction of the entry
computation is one kernel (a fusion, a GEMM, a cuDNN call, a copy); its bytes are its operands' and
results' sizes (read and written once, no cache; an operand a fusion reads only through slices, the
slices'), its FLOPs its matrix products'. A kernel takes at
least max(bytes / HBM bandwidth, FLOPs / peak), the program the sum: a lower bound with perfect
kernels and no launch gaps, in the rows of the measured profile (`bert_jax.benchmark.profile.ROWS`).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import re

from bert_jax.benchmark.profile import ROWS, classify, parse_hlo
from bert_jax.model import flash

BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
         "s64": 8, "u64": 8, "f64": 8, "f8e4m3fn": 1, "f8e5m2": 1}
ARRAY = re.compile(r"\b(" + "|".join(BYTES) + r")\[([0-9,]*)\]")
LINE = re.compile(r"^\s*(?:ROOT\s+)?%(?P<name>[\w.\-]+)\s+=\s+(?P<shape>.+?)\s(?P<op>[a-z][a-z0-9\-]*)\((?P<args>.*)$")
DOT = re.compile(r"\s(?P<shape>\S+)\s+dot\(%(?P<lhs>[\w.\-]+),.*?lhs_contracting_dims=\{(?P<k>[0-9,]*)\}")
SLICES = {"slice", "dynamic-slice"}  # a fusion's parameter read only through these: only their bytes move
FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id", "replica-id"}
LOOPS = {"while", "conditional", "call"}
# cuDNN's attention, FLOPs per B·N·T·S·H: 2 products forward (4), 5 backward with the scores recomputed (10).
FMHA_FLOPS = {"forward": 4, "backward": 10}
# The model's Pallas flash attention (bert_jax/model/flash.py), per B·N·H and (query, key) pair it
# computes: 2 products forward; backward 7 (scores and dO·Vᵀ twice: once for dK, dV, once for dQ).
FLASH_FLOPS = {"forward": 4, "backward": 14}
FLASH = re.compile(r"flash_(forward|backward)(?:_window(\d+))?(?:_block(\d+))?")  # `flash.Tiling.name`
CUBLAS_CONTRACTING = re.compile(r'"lhs_contracting_dimensions":\[([^\]]*)\]')  # a cuBLAS call's backend_config


@dataclasses.dataclass(frozen=True)
class Kernel:
    name: str
    row: str  # a row of the profile table (`ROWS`)
    what: str  # JAX's name stack of the instruction (its op_name, less the jit), or its name
    bytes: int  # operands and results
    flops: int  # its matrix products' (and fused attention's)


def dims(shape: str) -> list[list[int]]:
    """The dimensions of every array in an HLO shape (``bf16[2,3]{1,0}``, or a tuple of them)."""
    return [[int(d) for d in ds.split(",") if d] for _, ds in ARRAY.findall(shape)]


def array_bytes(shape: str) -> int:
    return sum(BYTES[t] * math.prod(int(d) for d in ds.split(",") if d) for t, ds in ARRAY.findall(shape))


def flops(ins, lines: list[str], operand_shapes: list[str], shape: str = "") -> int:
    """2 · output · contracted size for each ``dot`` among ``lines`` (the kernel's computation) or of
    a cuBLAS call (its result ``shape``), or cuDNN attention's from q [B, T, N, H] and k [B, S, N, H]
    (its first two operands), or the flash kernel's from q (its first [B, T, N, H] operand) and the
    blocks its window visits."""
    if ins is not None and ins.target == "__gpu$xla.gpu.triton" and (m := FLASH.search(ins.op_name)):
        b, t, n, h = next((d[0] for d in map(dims, operand_shapes) if d and len(d[0]) == 4), [0] * 4)  # q
        block = int(m[3] or flash.BLOCK)
        return FLASH_FLOPS[m[1]] * b * n * h * block**2 * flash.block_pairs(t, int(m[2] or 0), block)
    if ins is not None and ins.target.startswith("__cublas") and (c := CUBLAS_CONTRACTING.search(ins.line)):
        out, lhs = (dims(shape) or [[]])[0], (dims(operand_shapes[0]) or [[]])[0]  # the result's first array: C
        return 2 * math.prod(out) * math.prod(lhs[int(i)] for i in re.findall(r"\d+", c[1])) if lhs else 0
    if ins is not None and ins.target.startswith("__cudnn$fmha"):
        q, k = ((dims(s) or [[]])[0] for s in operand_shapes[:2])
        per = FMHA_FLOPS["backward" if "backward" in ins.target.lower() else "forward"]
        return per * q[0] * q[2] * q[1] * k[1] * q[3] if len(q) == len(k) == 4 else 0
    shapes = {m["name"]: m["shape"] for m in map(LINE.match, lines) if m}
    total = 0
    for m in filter(None, map(DOT.search, lines)):
        if lhs := (dims(shapes.get(m["lhs"], "")) or [[]])[0]:
            total += 2 * math.prod(dims(m["shape"])[0]) * math.prod(lhs[int(i)] for i in m["k"].split(",") if i)
    return total


def operand_bytes(body: list[str], args: list[str]) -> int:
    """The bytes a kernel reads of its operands (shapes ``args``): each operand whole, but one that a
    fusion's computation (``body``) uses only through slices, directly or through bitcasts: those
    slices' bytes (XLA merges products that share an input, e.g. ModernBERT's q, k and v, into one
    [tokens, 3·hidden] result, and each consumer reads its third)."""
    full = [array_bytes(a) for a in args]
    params, users = {}, collections.defaultdict(list)  # parameter number -> name; name -> its users
    for m in filter(None, map(LINE.match, body)):
        if m["op"] == "parameter" and (n := re.match(r"\s*(\d+)\)", m["args"])):
            params[int(n[1])] = m["name"]
        for a in set(re.findall(r"%([\w.\-]+)", m["args"])):
            users[a].append((m["op"], m["name"], m["shape"]))

    def sliced(name: str) -> int | None:  # the bytes of the slices that are all of name's uses, else None
        parts = [array_bytes(shape) if op in SLICES else sliced(user) if op == "bitcast" else None
                 for op, user, shape in users.get(name, [])]
        return sum(parts) if parts and None not in parts else None

    for i, name in params.items():
        if i < len(full) and (part := sliced(name)) is not None:
            full[i] = min(full[i], part)
    return sum(full)


def kernels(hlo_text: str) -> list[Kernel]:
    """The entry computation's kernels. Raises ValueError for a program with loops (scanned layers,
    micro-batches): a loop's body would be counted once."""
    instructions, computations = parse_hlo(hlo_text)
    bodies = collections.defaultdict(list)  # computation -> its instructions' lines
    for ins in instructions.values():
        bodies[ins.computation].append(ins.line)
    if "ENTRY" not in bodies:
        raise ValueError("no ENTRY computation in the HLO text")
    shapes, out = {}, []
    for line in bodies["ENTRY"]:
        if (m := LINE.match(line)) is None:
            continue
        name, op, ins = m["name"], m["op"], instructions.get(m["name"])
        shapes[name] = m["shape"]
        if op in LOOPS:
            raise ValueError(f"the program has a {op} ({name}): its body would be counted once; compile it "
                             "with unrolled layers and no micro-batches")
        if op in FREE:
            continue
        depth = itertools.accumulate((c == "(") - (c == ")") for c in m["args"])  # the call's ")" at -1
        end = next((i for i, d in enumerate(depth) if d < 0), len(m["args"]))
        args = [shapes.get(a, "") for a in re.findall(r"%([\w.\-]+)", m["args"][:end])]
        what = re.sub(r"^jit\([^)]*\)/", "", ins.op_name) if ins is not None and ins.op_name else name
        result = array_bytes(m["shape"])
        if op == "custom-call" and len(arrays := ARRAY.findall(m["shape"])) > 1 and arrays[-1][0] in ("u8", "s8"):
            result -= array_bytes("{}[{}]".format(*arrays[-1]))  # cuBLAS's and cuDNN's workspace: not moved
        body = bodies.get(ins.calls, []) if ins and ins.calls else None  # a fusion's computation
        out.append(Kernel(name, classify(name, ins, computations), what, result + operand_bytes(body or [], args),
                          flops(ins, [line] if body is None else body, args, m["shape"])))
    return out


def table(ks: list[Kernel], peak: float, bandwidth: float, top: int = 3) -> dict:
    """{"rows": [{row, kernels, bytes, flops, ms, top}], "ms", "bytes", "flops"}: the least time per
    row (each kernel's max(bytes / ``bandwidth``, FLOPs / ``peak``)) and for the program (their sum);
    ``top``: the row's largest name stacks, with their ms."""
    rows = []
    for row in ROWS[:-1]:  # no host gaps in a roofline
        group, times = [k for k in ks if k.row == row], collections.Counter()
        for k in group:
            times[k.what] += max(k.bytes / bandwidth, k.flops / peak) * 1e3
        rows.append({"row": row, "kernels": len(group), "bytes": sum(k.bytes for k in group),
                     "flops": sum(k.flops for k in group), "ms": sum(times.values()), "top": times.most_common(top)})
    return {"rows": rows, "ms": sum(r["ms"] for r in rows), "bytes": sum(k.bytes for k in ks),
            "flops": sum(k.flops for k in ks)}


def markdown(t: dict) -> str:
    rows = [(r["row"], r["ms"], f"{100 * r['ms'] / t['ms']:.1f}%", r["kernels"], r["bytes"], r["flops"],
             ", ".join(f"{n} {ms:.2f}" for n, ms in r["top"])) for r in t["rows"]]
    rows.append(("the step", t["ms"], "", sum(r["kernels"] for r in t["rows"]), t["bytes"], t["flops"], ""))
    head = ["| where | least ms / step | share | kernels | GB moved | TFLOP | largest (ms) |", "|---" * 7 + "|"]
    return "\n".join(head + [f"| {a} | {ms:.2f} | {share} | {n} | {b / 1e9:.2f} | {f / 1e12:.2f} | {top} |"
                             for a, ms, share, n, b, f, top in rows])


def furthest(per_kernel: dict[str, tuple[float, float]], ks: list[Kernel], peak: float, bandwidth: float,
             top: int = 12) -> list[dict]:
    """The measured kernels furthest over their least time: ``per_kernel`` ({HLO instruction: (ms, runs) a
    step}, `bert_jax.benchmark.profile.reduce_profile`'s) against each instruction's least time per run
    (a fusion XLA shares between layers runs under one name: its runs). [{name, what, row, ms, least_ms,
    runs}], the largest ms − least_ms first; kernels the program does not name are left out."""
    by_name = {k.name: k for k in ks}
    rows = [{"name": n, "what": by_name[n].what, "row": by_name[n].row, "ms": ms, "runs": runs,
             "least_ms": runs * max(by_name[n].bytes / bandwidth, by_name[n].flops / peak) * 1e3}
            for n, (ms, runs) in per_kernel.items() if n in by_name]
    return sorted(rows, key=lambda r: r["least_ms"] - r["ms"])[:top]


def furthest_markdown(rows: list[dict]) -> str:
    head = ["| kernel | what | row | runs | ms / step | least ms | over |", "|---" * 7 + "|"]
    return "\n".join(head + [f"| {r['name']} | {r['what'][:70]} | {r['row']} | {r['runs']:.0f} | {r['ms']:.2f} | "
                             f"{r['least_ms']:.2f} | {r['ms'] / max(r['least_ms'], 1e-9):.1f}x |" for r in rows])
