"""Elementwise fusion: a chain of pointwise ops over one shape runs as one pass over memory, block by block.

An op declares itself pointwise with the trait ``pointwise`` (``opforge.core.opdef.TRAITS``): each output element
depends only on the input elements at its position. The executor groups such ops where every intermediate result has
the group's shape and is read only inside the group (not fetched, not read by another op), and runs the group as one
step: the members' own kernels, in order, on blocks of rows small enough to stay in cache. Inputs are read from memory
once per block, intermediates live in a few block-sized scratch buffers from the executor's workspace, and the
result is written once. The kernels run unchanged on row slices, so a fused result is bit for bit the unfused one.

Why NumPy blocks, and not numexpr or numba: measured on this project's machine (AMD EPYC, AVX2, 1 thread, 1,000,000
float32, CPU time, ratios to PyTorch eager in the same process):

    expression                                   NumPy blocks   numexpr 2.14   numba 0.68 (one loop)
    9 arithmetic ops (gelu-tanh without tanh)       0.44×           1.8×           0.08×
    the same with its tanh (10 ops)                 0.75×           3.8×           3.2×

numba wins on plain arithmetic by a wide margin, but its tanh/exp are scalar libm calls, 4–5× slower than NumPy's
SIMD loops (and PyTorch's), it costs 0.7 s to import and 0.2–1 s to compile each new group, and it would need a
second, scalar definition of every op's arithmetic. numexpr is slower than NumPy on both here (its float32
transcendentals are scalar too, without Intel's VML). NumPy blocks reuse each op's one kernel, add no dependency
and keep the bits; a group whose time goes to transcendentals is bound by NumPy's SIMD kernels either way.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.errors import ShapeError
from ..core.opdef import Kernel, registry
from ..core.spec import Spec
from . import fastcall

# Elements per block. Blocking pays where a group's arrays outgrow the caches: on this machine (1 MiB of L2 and
# 32 MiB of L3), a 9-op float32 group on whole arrays costs 1.2 ns per element at 250K elements, 1.9 at 1M and 3.4
# at 4M and beyond; in blocks of 32K to 512K elements it stays at 1.1–1.6 at every size. Smaller blocks pay more in
# per-call overhead (8K: 0.64× PyTorch eager at 1M, against 0.45× for 32K), and writing over an input that dies in
# the group beats a separate scratch buffer (the lines are in cache already), so blocks are large: 256K elements.
BLOCK = 262144


class FusedOp:
    """One step of a plan standing for a group of pointwise ops: ``members`` ((OpDesc, attrs, Kernel), in program
    order; the last, the root, gives the output). ``inputs`` are the values the group reads from outside it;
    ``donated`` those of them that die in the group and own their buffers, which members may write into."""

    type = "fused"
    alone = False  # one op standing alone (native.single_loops): it keeps its kernel's layouts and in-place slots

    def __init__(self, members: list, inputs: list, output: str, spec: Spec, specs: dict, donated: set):
        self.members = members
        self.inputs = inputs
        self.output = output
        self.spec = spec
        self.specs = specs
        shape = spec.shape
        rows = shape[0] if shape else 1
        width = math.prod(shape[1:])
        self.rows = max(1, BLOCK // max(width, 1))  # rows per block
        self.blocked = rows > self.rows
        # inputs read block by block (their rows are the output's rows); the others broadcast whole
        self.sliced = {n for n in inputs if self.blocked and len(specs[n].shape) == len(shape)
                       and specs[n].shape[0] == rows}
        self.donated = {n for n in donated if specs[n] == Spec(shape, specs[n].dtype)}
        root = members[-1][0]
        # inputs whose buffer may receive the output: with the output's Spec (so read block by block), and not
        # read by the root except through its in-place slots (the root writes its block after reading it there)
        writable = set(in_place_slots(root))
        self.inplace_inputs = [n for n in inputs if specs[n] == spec and (n in self.sliced or not self.blocked)
                               and all(n not in names or slot in writable for slot, names in root.inputs.items())]
        self.native = None  # the group's native function, if opforge.program.native made one (set_native)
        self.prepare(None)

    def set_native(self, fn, c_source: str) -> None:
        """Run the group as ``fn`` (a C loop that reads every input at an element before it writes the output there,
        so the output may go to any input of its Spec) instead of its members' kernels."""
        self.native, self.c_source = fn, c_source
        if not self.alone:  # (an op alone writes where its kernel may: where it runs its kernel, the buffers
            # flow as without the loop; a conv's strided output taken for relu_grad's made each step allocate anew)
            self.inplace_inputs = [n for n in self.inputs if self.specs[n] == self.spec]
        self.prepare(None)

    def input_names(self) -> list:
        return list(self.inputs)

    def output_names(self) -> list:
        return [self.output]

    def __repr__(self) -> str:
        # bounded: the executor labels each member's line of generated code with it
        names = [op.output_names()[0] for op, _, _ in (self.members if len(self.members) <= 6 else
                                                          [*self.members[:3], *self.members[-2:]])]
        if len(self.members) > 6:
            names.insert(3, f"... {len(self.members) - 5} more ...")
        return f"fused({', '.join(names)})"

    def scratch_bytes(self) -> int:
        return sum(math.prod(s.shape) * s.dtype.itemsize for s in self.scratch)

    def prepare(self, out_input: str | None) -> None:
        """Plan where each member writes, once the executor knows which input's buffer (if any) receives the output.

        A member writes into: the buffer of an input it reads last through an in-place slot (a donated input, a
        scratch buffer, or the output's own buffer), else a free buffer, else a new scratch buffer (block-sized);
        or, if its kernel takes no ``out=``, wherever the kernel puts it. The output's buffer can hold a value on
        its way to the root (read by the next member, once, through an in-place slot, and so on up to the root),
        once the input it may share its memory with (``out_input``) has been read for the last time."""
        if self.native is not None:  # one loop, no scratch buffers
            self.scratch, self._plan, self._out_input = [], [], out_input
            return
        specs, members = self.specs, self.members
        last, readers = {}, {}  # value -> the last member reading it; -> the members reading it
        for j, (op, _, _) in enumerate(members):
            for n in dict.fromkeys(op.input_names()):
                last[n] = j
                readers.setdefault(n, []).append(j)
        on_path = {len(members) - 1}  # members whose result goes to the root through in-place slots only
        for j in range(len(members) - 2, -1, -1):
            out = members[j][0].output_names()[0]
            reader = readers.get(out, [])
            if len(reader) == 1 and reader[0] in on_path and members[reader[0]][0].input_names().count(out) == 1 \
                    and out in in_place_inputs(members[reader[0]][0]):
                on_path.add(j)
        scratch, plan = [], []
        held = {n: n for n in self.donated if n != out_input}  # value -> the buffer it is in
        pinned = {}  # value -> more buffers it may share (its kernel took no out=: it may return an input, a view)
        free = []
        if out_input is None:
            free.append("dst")
        else:
            held[out_input] = "dst"
        block_shape = (self.rows, *self.spec.shape[1:]) if self.blocked else self.spec.shape

        def dtype_of(buffer):
            return (scratch[buffer].dtype if isinstance(buffer, int) else
                    self.spec.dtype if buffer == "dst" else specs[buffer].dtype)

        def usable(buffer, j, dtype):
            return dtype_of(buffer) == dtype and (buffer != "dst" or j in on_path)

        for j, (op, _, kernel) in enumerate(members[:-1]):
            out = op.output_names()[0]
            dtype = specs[out].dtype
            dying = [n for n in dict.fromkeys(op.input_names()) if last.get(n) == j and n in held]
            buffer = None
            if kernel.takes_out:
                reads = op.input_names()
                for n in in_place_inputs(op):
                    if n in dying and reads.count(n) == 1 and usable(held[n], j, dtype):
                        buffer = held[n]
                        dying.remove(n)
                        break
                if buffer is None:
                    buffer = next((b for b in sorted(free, key=lambda b: b == "dst") if usable(b, j, dtype)), None)
                    if buffer is None:
                        buffer = len(scratch)
                        scratch.append(Spec(block_shape, dtype))
                    else:
                        free.remove(buffer)
                held[out] = buffer
            elif dying:  # the result may be its input itself (identity): the inputs' buffers are its buffers now
                buffers = [b for n in dying for b in (held.pop(n), *pinned.pop(n, ()))]
                held[out], pinned[out] = buffers[0], buffers[1:]
                dying = []
            free.extend(b for n in dying for b in (held.pop(n), *pinned.pop(n, ())))
            plan.append(buffer)
        self.scratch, self._plan, self._out_input = scratch, plan, out_input

    def source(self, name: str, pools: list, env: dict) -> tuple[list, dict]:
        """The group as Python source: ``def <name>(<inputs>, W, out=None)``, W the run's workspace (lists of spare
        buffers, ``pools[k]`` the one for scratch buffer k, None if it has none). Returns (lines, {line index:
        member label})."""
        if self.native is not None:
            return self._native_source(name, env)
        empty = env["_empty"]  # the device's array module's
        args = [f"i{k}" for k in range(len(self.inputs))]
        arg = dict(zip(self.inputs, args))
        inputs = "".join(f"{a}, " for a in args)
        nscratch = len(self.scratch)
        scratch = "".join(f"s{k}, " for k in range(nscratch))
        early = "dst" in self._plan  # a member before the root writes into the output's buffer
        root_takes_out = self.members[-1][2].takes_out
        # the output's buffer: the one given, unless an input shares its memory in another layout (a view of it),
        # which writing the output before reading that input would clobber: then a new one, copied over at the end
        dst = f"    dst = out if out is not None and not _overlap(out, ({inputs})) else {name}_e()"
        head = [f"def {name}({inputs}W, out=None):  # {self!r}"]
        for k, spec in enumerate(self.scratch):
            env[f"{name}_e{k}"] = _allocator(empty, spec)
            if pools[k] is None:  # not kept between runs (see executor._Workspace)
                head.append(f"    s{k} = {name}_e{k}()")
            else:
                head.append(f"    p{k} = W[{pools[k]}]; s{k} = p{k}.pop() if p{k} else {name}_e{k}()")
        env[f"{name}_e"] = _allocator(empty, self.spec)
        body, labels, local = [], {}, dict(arg)
        target = "o" if self.blocked else "dst"  # where the output's block is written
        for j, (op, attrs, kernel) in enumerate(self.members):
            env[f"{name}_k{j}"] = kernel.bind(env["_device"])
            call = [(local[op.inputs[p.name][0]] if op.inputs[p.name] else "None")
                    for p in registry.get(op.type).inputs]
            if attrs:
                env[f"{name}_a{j}"] = attrs
                call.append(f"**{name}_a{j}")
            out = op.output_names()[0]
            labels[len(body)] = f"{op.type} -> {out}"
            k = f"{name}_k{j}({', '.join(call)}"
            if j < len(self.members) - 1:
                buffer = self._plan[j]
                if buffer is not None:
                    k += ", out=" + (target if buffer == "dst" else f"s{buffer}" if isinstance(buffer, int)
                                     else arg[buffer])
                local[out] = f"t{j}"
                body.append(f"    t{j} = {k})")
            elif self.blocked or early or root_takes_out:
                body.append(f"    {k}, out={target})" if root_takes_out else f"    {target}[...] = {k})")
            else:
                # the root's own result: copied into the buffer given, or, if none was, made an array of its own
                # (never a scratch buffer, which goes back to the workspace, nor a view of an input)
                body += [f"    y = {k})", "    if out is not None:", "        _copyto(out, y)", "        y = out",
                         f"    elif _escapes(y, ({scratch})):", "        y = y.copy()"]
        result = "y" if body[-1] == "        y = y.copy()" else "dst"
        if self.blocked:
            rows = self.spec.shape[0]
            full, tail = divmod(rows, self.rows)
            step = self.rows  # (the blocks' slices made as they run: a list of them was as long as the rows)
            lines = [*head, dst, f"    for r in range(0, {full * step}, {step}):",
                     f"        {name}_block({inputs}dst, slice(r, r + {step}), {scratch})"]
            if tail:
                env[f"{name}_tail"] = slice(full * self.rows, rows)
                views = "".join(f"s{k}[:{tail}], " for k in range(nscratch))
                lines.append(f"    {name}_block({inputs}dst, {name}_tail, {views})")
        else:
            lines = list(head)
            if result == "dst":
                lines.append(dst if early else f"    dst = out if out is not None else {name}_e()")
        end = []
        if result == "dst":
            end += ["    if out is not None and dst is not out:", "        _copyto(out, dst)", "        dst = out"]
        end += [f"    p{k}.append(s{k})" for k in range(nscratch) if pools[k] is not None]
        end.append(f"    return {result}")
        if self.blocked:
            lines += end
            lines.append(f"def {name}_block({inputs}dst, r, {scratch}):")
            lines += [f"    {arg[n]} = {arg[n]}[r]" for n in self.inputs if n in self.sliced]
            lines.append("    o = dst[r]")
            offset = len(lines)
            lines += body
        else:
            offset = len(lines)
            lines += body + end
        return lines, {offset + k: v for k, v in labels.items()}


    def _native_source(self, name: str, env: dict) -> tuple[list, dict]:
        """The Python side of a native group: C-ordered inputs (its loop assumes them) and a C-ordered output that
        shares no memory with an input in another layout, then one call. The C source is in ``.c_source``."""
        args = [f"i{k}" for k in range(len(self.inputs))]
        inputs = "".join(f"{a}, " for a in args)
        env[f"{name}_n"] = self.native
        env[f"{name}_e"] = _allocator(env["_empty"], self.spec)
        lines = [f"def {name}({inputs}W, out=None):  # {self!r}, native"]
        # The loop reads through the plan's static shapes: an input of another shape or dtype (an op whose kernel
        # breaks its own shape rule) must fail here, not read out of bounds.
        env[f"{name}_specs"] = [(self.specs[n].shape, self.specs[n].dtype) for n in self.inputs]
        check = " or ".join(f"{a}.shape != {self.specs[n].shape!r} or {a}.dtype != {name}_specs[{k}][1]"
                            for k, (a, n) in enumerate(zip(args, self.inputs)))
        slow = [f"    if {check}:", f"        _mismatch({repr(self)!r}, ({inputs}), {name}_specs)"]
        env.setdefault("_mismatch", _mismatch)
        if self.alone:  # an op alone (native.single_loops): in another layout its kernel, which reads
            # strides, beats copying each input for the loop (a conv's NHWC output read as NCHW: 2-4x)
            op, attrs, kernel = self.members[0]
            opdef = registry.get(op.type)
            env[f"{name}_k"], env[f"{name}_a"] = kernel.bind(env["_device"]), attrs
            slots = ", ".join(f"i{self.inputs.index(op.inputs[p.name][0])}" if op.inputs[p.name] else "None"
                              for p in opdef.inputs)
            strided = " or ".join([f"not {a}.flags.c_contiguous" for a, n in zip(args, self.inputs)
                                   if self.specs[n].shape != ()] + ["(out is not None and not out.flags.c_contiguous)"])
            if kernel.takes_out:
                run_kernel = [f"        return {name}_k({slots}, **{name}_a, out=out)"]
            else:
                run_kernel = [f"        y = {name}_k({slots}, **{name}_a)",
                              "        return y if out is None else (_copyto(out, y), out)[1]"]
            slow += [f"    if {strided}:", *run_kernel]
        slow += [f"    if not {a}.flags.c_contiguous: {a} = _contiguous({a})" for a, n in zip(args, self.inputs)
                 if self.specs[n].shape != ()]
        if fastcall.checks(env):  # the same looks in C first; the lines above where they say no
            env[f"{name}_plan"] = fastcall.plan_specs(env[f"{name}_specs"])
            lines += [f"    if not _planned({name}_plan, {inputs}):", *("    " + line for line in slow)]
            if self.alone:  # (its inputs in order, its output maybe not)
                lines += ["    if out is not None and not out.flags.c_contiguous:", *run_kernel]
            lines.append(f"    dst = out if out is not None and _into(out, {inputs}) else {name}_e()")
        else:
            lines += [*slow, "    dst = out if out is not None and out.flags.c_contiguous and "
                             f"not _overlap(out, ({inputs})) else {name}_e()"]
        lines += [f"    {fastcall.pointer_call(name + '_n', [*args, 'dst'], env)}",
                  "    if out is not None and dst is not out:", "        _copyto(out, dst)", "        dst = out",
                  "    return dst"]
        env.setdefault("_contiguous", np.ascontiguousarray)
        labels = {len(lines) - 5: " -> ".join(op.type for op, _, _ in self.members[:8])}
        return lines, labels


def _mismatch(group: str, arrays: tuple, specs: list):
    got = ", ".join(f"{a.dtype}{list(a.shape)}" for a in arrays)
    want = ", ".join(f"{d}{list(s)}" for s, d in specs)
    raise ShapeError(f"{group}: the inputs of its native loop are ({got}), the plan's shape rules said ({want})")


def _allocator(empty, spec: Spec):
    shape, dtype = spec.shape, spec.dtype
    return lambda: empty(shape, dtype)


def overlap(out, inputs: tuple) -> bool:
    """Whether an input other than ``out`` itself shares memory with it (a view of it in another layout)."""
    return any(x is not out and isinstance(x, np.ndarray) and np.may_share_memory(x, out) for x in inputs)


def escapes(y, scratch: tuple) -> bool:
    """Whether ``y`` is a view (of an input or a scratch buffer), or one of the scratch buffers itself."""
    return y.base is not None or any(y is s for s in scratch)


def in_place_slots(op) -> list:
    """The input slots (parameter names) of ``op`` whose buffer its output may be written into: its ``inplace``
    input, and the other input of a commutative op."""
    opdef = registry.get(op.type)
    slots = list(opdef.inplace.values())
    if "commutative" in opdef.traits and slots:
        slots += [p.name for p in opdef.inputs if p.name not in slots]
    return slots


def in_place_inputs(op) -> list:
    """The variables in ``op``'s in-place slots, in slot order."""
    return [n for slot in in_place_slots(op) for n in op.inputs.get(slot, [])]


def broadcast_summands(ops: list, kernels: list, specs: dict, keep: set) -> tuple[list, list]:
    """An ``add_n`` summing a ``broadcast_to`` that nothing else reads (a bias's tangent in a second-order program)
    reads the value before it was broadcast: add_n broadcasts as NumPy's add does, so the same values, one step
    fewer (a broadcast_to costs 15-20 µs right after a large GEMM, its view built by NumPy's Python code). Only
    where another summand has the whole shape, so that the sum's shape stays what the plan says."""
    producer = {n: i for i, (op, _) in enumerate(ops) for n in op.output_names()}
    readers = {}
    for i, (op, _) in enumerate(ops):
        for n in op.input_names():
            readers.setdefault(n, []).append(i)
    gone, changed = set(), {}
    for i, (op, _) in enumerate(ops):
        if isinstance(op, FusedOp) or op.type != "add_n":
            continue
        summands, spec = op.inputs["xs"], specs[op.output_names()[0]]
        if len(set(summands)) != len(summands) or len(summands) < 2:
            continue
        read = list(summands)
        for k, n in enumerate(summands):
            j = producer.get(n)
            if (j is None or n in keep or readers.get(n) != [i] or isinstance(ops[j][0], FusedOp)
                    or ops[j][0].type != "broadcast_to" or specs[n] != spec):
                continue
            source = ops[j][0].input_names()[0]
            if specs[source].dtype == spec.dtype:
                read[k] = source
                gone.add(j)
        if read == summands:
            continue
        if not any(specs[n] == spec for n in read):  # every summand broadcast: keep one as it was
            k = next(k for k, n in enumerate(read) if n != summands[k])
            gone.discard(producer[summands[k]])
            read[k] = summands[k]
        changed[i] = read
    if not changed:
        return ops, kernels
    new_ops, new_kernels = [], []
    for i, ((op, attrs), kernel) in enumerate(zip(ops, kernels)):
        if i in gone:
            continue
        if i in changed:
            op = type(op)(op.type, {**op.inputs, "xs": changed[i]}, op.outputs, op.attrs, op.role)
        new_ops.append((op, attrs))
        new_kernels.append(kernel)
    return new_ops, new_kernels


def fuse(ops: list, kernels: list, specs: dict, keep: set, member=None) -> tuple[list, list]:
    """Replace each group of two or more fusable ops by a ``FusedOp`` at the place of its last member.
    ``keep``: variables that must exist after the run (fetched, written back): never internal to a group.
    ``member(op)``, if given, must also hold for an op to join a group (on a device, that it can be translated:
    the others keep their own kernels and their neighbours still fuse)."""
    producer, readers = {}, {}
    for i, (op, _) in enumerate(ops):
        for n in op.output_names():
            producer[n] = i
        for n in op.input_names():
            readers.setdefault(n, set()).add(i)

    def fusable(i) -> bool:
        op = ops[i][0]
        if isinstance(op, FusedOp):  # a native region made before (opforge.program.native)
            return False
        opdef = registry.get(op.type)
        return ("pointwise" in opdef.traits and len(opdef.outputs) == 1 and not opdef.outputs[0].is_list
                and not any(p.is_list for p in opdef.inputs) and (member is None or member(op)))

    group_of, groups = {}, []
    for i in reversed(range(len(ops))):
        if i in group_of or not fusable(i):
            continue
        shape = specs[ops[i][0].output_names()[0]].shape
        members, frontier = {i}, [i]
        while frontier:
            for n in ops[frontier.pop()][0].input_names():
                p = producer.get(n)
                if (p is None or p in members or p in group_of or not fusable(p) or n in keep
                        or specs[n].shape != shape or not readers[n] <= members):
                    continue
                members.add(p)
                frontier.append(p)
        if len(members) > 1:
            for m in members:
                group_of[m] = len(groups)
            groups.append(sorted(members))
    if not groups:
        return ops, kernels
    # a value dies in its group when only members read it; it is the group's to overwrite if its buffer is its own
    # (written by an out= kernel: not a view of another array, nor a feed or a parameter)
    donated = {n for n, p in producer.items() if n not in keep and kernels[p].takes_out
               and len(ops[p][0].output_names()) == 1}
    new_ops, new_kernels = [], []
    for i, ((op, attrs), kernel) in enumerate(zip(ops, kernels)):
        g = group_of.get(i)
        if g is None:
            new_ops.append((op, attrs))
            new_kernels.append(kernel)
            continue
        members = groups[g]
        if i != members[-1]:
            continue  # emitted with the group, at the place of its last member
        inside = {n for m in members for n in ops[m][0].output_names()}
        inputs = list(dict.fromkeys(n for m in members for n in ops[m][0].input_names() if n not in inside))
        output = op.output_names()[0]
        member_set = set(members)
        fused = FusedOp([(ops[m][0], ops[m][1], kernels[m]) for m in members], inputs, output, specs[output],
                        specs, {n for n in inputs if n in donated and readers[n] <= member_set})
        new_ops.append((fused, {}))
        new_kernels.append(Kernel(None, None, None, True, False, False))
    return new_ops, new_kernels
