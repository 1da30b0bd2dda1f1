"""Recurrent sequence ops: ``lstm_layer`` and ``gru_layer`` run one layer of one direction over a whole sequence.

What stays outside them is one ``linear`` over all steps: the input projection gx = x·W_ihᵀ + b (T·N rows at once,
the layer's biggest product). Inside, each step is one h·W_hhᵀ product into the step's gate block and the gate math
in a few passes over it; the gradient ops do backpropagation through time the same way, one (dgates·W_hh) product a
step, and the layers' rules take the weight gradient as ONE product over all steps (dgatesᵀ·h_prev), not T small
ones.

Gate order is torch's (its ``weight_ih_l0`` layout): LSTM i, f, g, o; GRU r, z, n with n = tanh(gx_n + r·(h·W_hnᵀ +
b_hn)). ONNX orders LSTM gates i, o, f, c and GRU's z, r, h: an exporter permutes the blocks of W and B.

**What the forward ops return.** Besides the outputs y (T, N, H) every step, the ops return what their backward
pass reads: ``lstm_layer`` the cell states of every step and the activated gates, ``gru_layer`` the activated gates
and hn = h·W_hnᵀ + b_hn. Outputs, not hidden residuals: a compiled program keeps them from the forward pass instead
of computing the sequence again, and gradients that reach them (of higher orders, or of a user who reads them)
flow back like any other. The last state is y[-1] (y[0] when reverse); an LSTM's last cell state cells[-1].

**Variable lengths** (PackedSequence): ``batch_sizes`` (T,) int64 gives, per time step, how many rows take part (the
first ones: batches sorted by decreasing length, as a PackedSequence packs them). A row past its length keeps its
state: y[t] and cells[t] repeat the previous step's values (so y[-1] is every row's last state, and a reverse pass
starts each row from h0 at its own last step), its gates are 0, and no gradient flows through it.

**Gradients to any order.** ``lstm_layer_grad``/``gru_layer_grad`` compute the backward pass of a whole sequence.
They are linear in their output gradients (dy, and those of the gates and states), so their own gradient rules are:
in those, the same recursion run forwards (the tangent, or JVP, of the forward pass), and in the coefficients (the
gates, states, weights) products of the two sweeps' values step by step. Those rules are written with ops over the
unrolled steps (dozens of small ops a step: second and higher orders are correct, not fast), which is what makes
them differentiable again.

The sigmoid is computed as 0.5·tanh(x/2) + 0.5 (one fast pass of tanh over the whole gate block; ``scipy``'s expit
is 3x slower here). Its absolute error is half an ulp of 1, as torch's (float32: 6.0e-8 against torch's 8.9e-8 over
[−30, 30]); a gate near 0 keeps fewer significant digits than torch's (relative error 2.4e-5 where σ > 1e-3), which
for a factor that multiplies a state is the same absolute error.
"""

from opforge import ops as F

from ._common import Sample, ShapeError, Spec, np, op
from .half import add_half_kernels
from .nn import _same_dims, _validate

# -- shared helpers --------------------------------------------------------------------------------------------------


def _steps(t: int, reverse: bool):
    """Time indices in the order the recursion visits them."""
    return range(t - 1, -1, -1) if reverse else range(t)


def _active(batch_sizes, t: int, n: int) -> int:
    return n if batch_sizes is None else int(batch_sizes[t])


def _sizes(name: str, batch_sizes, t: int, n: int):
    """batch_sizes as Python ints (None: all rows every step), checked: one per step, each in [0, N]."""
    if batch_sizes is None:
        return None
    sizes = batch_sizes.tolist()
    if len(sizes) != t or any(not 0 <= b <= n for b in sizes):
        raise ShapeError(f"{name}(): batch_sizes must hold one count in [0, {n}] per step ({t}), got {sizes}")
    return sizes


def _gate_rows(dtype, n: int, h: int, sigmoid: list):
    """(scale, shift) over an (n, gates·h) gate block that turn tanh into the sigmoid where ``sigmoid`` says:
    σ(x) = 0.5·tanh(0.5·x) + 0.5 (the scalings by 0.5 are exact), and tanh itself elsewhere (scale 1, shift 0).
    Whole blocks, not rows: a ufunc of two operands of one shape runs twice as fast as one broadcasting a row
    (2.4 against 4.7 µs, 20×1024 float32)."""
    flags = np.repeat(np.array(sigmoid), h)
    rows = np.where(flags, 0.5, 1.0).astype(dtype), np.where(flags, 0.5, 0.0).astype(dtype)
    return tuple(np.broadcast_to(r, (n, len(flags))).copy() for r in rows)


class _StepProduct:
    """``a·w`` for the few rows ``a`` (N, K) of one step and a fixed w (K, M), into a given (N, M) array: the one
    product per step of a recurrent layer. For float32 and at most 64 rows it runs as a stack of column blocks of w
    (one ``matmul`` call on (k, K, width) blocks, then one pass that lays the (k, N, width) result out as (N, M)):
    OpenBLAS multiplies such narrow blocks with its small-matrix kernel, faster than the whole product (measured,
    CPU time, one thread, N = 20: (20, 256)·(256, 1024) 125 → 94 µs in blocks of 64 columns, (20, 256)·(256, 768)
    88 → 50 µs; (20, 1024)·(1024, 256) 126 → 84 µs in blocks of 32, (20, 768)·(768, 256) 95 → 54 µs). Each
    element is the same dot product either way; how BLAS splits its sum may differ in the last bit. Otherwise, one
    product from a contiguous copy of w (h·W_hhᵀ runs ~1.7x faster so than from the transposed view)."""

    FORWARD, BACKWARD = 64, 32  # block widths for h·W_hhᵀ and dgates·W_hh

    def __init__(self, w, n: int, width: int):
        k_dim, m = w.shape
        self.blocks = None
        if w.dtype == np.float32 and n <= 64 and m % width == 0 and m > width:
            self.k, self.width = m // width, width
            self.blocks = np.ascontiguousarray(w.reshape(k_dim, self.k, width).transpose(1, 0, 2))  # one copy
            self.scratch = np.empty((self.k, n, width), w.dtype)
        else:
            self.w = np.ascontiguousarray(w)

    def __call__(self, a, out, add=None):
        """out = a·w, or add + a·w where ``add`` (like out) is given."""
        if self.blocks is None:
            np.matmul(a, self.w, out=out)
            if add is not None:
                out += add
            return out
        b = a.shape[0]
        part = self.scratch[:, :b]
        np.matmul(a, self.blocks, out=part)
        laid = part.transpose(1, 0, 2)
        blocked = out.reshape(b, self.k, self.width)
        if add is None:
            np.copyto(blocked, laid)
        else:
            np.add(laid, add.reshape(b, self.k, self.width), out=blocked)
        return out


def _check_batch_sizes(op_name, batch_sizes, t):
    if batch_sizes is not None and (len(batch_sizes.shape) != 1 or not _same_dims(batch_sizes.shape, (t,))):
        raise ShapeError(f"{op_name}(): batch_sizes must have shape ({t},), one count per step, got "
                         f"{batch_sizes.shape}")


def _check_shape(op_name, name, spec, shape):
    if spec is not None and not _same_dims(tuple(spec.shape), tuple(shape)):
        raise ShapeError(f"{op_name}(): {name} must have shape {tuple(shape)}, got {tuple(spec.shape)}")


def _sequence_dims(op_name, gx, w_hh, gates: int):
    """(T, N, H) from gx (T, N, gates·H) and w_hh (gates·H, H), checked."""
    if len(gx.shape) != 3:
        raise ShapeError(f"{op_name}(): the input projection must be 3-D (T, N, {gates}·H), got shape {gx.shape}")
    if len(w_hh.shape) != 2:
        raise ShapeError(f"{op_name}(): w_hh must be 2-D ({gates}·H, H), got shape {w_hh.shape}")
    h = w_hh.shape[1]
    if h is not None:
        _check_shape(op_name, "w_hh", w_hh, (gates * h, h))
        _check_shape(op_name, "gx", gx, (gx.shape[0], gx.shape[1], gates * h))
    return gx.shape[0], gx.shape[1], h


def _previous(y, h0, reverse: bool):
    """h_prev for every step, in y's time order: y shifted one step along the recursion, h0 where it starts."""
    if y.shape[0] == 1:
        return F.unsqueeze(h0, axis=0)
    first = F.unsqueeze(h0, axis=0)
    return F.concat([y[1:], first] if reverse else [first, y[:-1]], axis=0)


def _masks(batch_sizes, n: int, dtype):
    """(T, N, 1) ones for the rows that take part in each step, zeros for the others (None: every row)."""
    if batch_sizes is None:
        return None
    rows = F.arange(start=0, stop=n, dtype=batch_sizes.dtype)
    return F.unsqueeze(F.cast(F.less(rows, F.unsqueeze(batch_sizes, axis=1)), dtype=dtype), axis=2)


def _blocks(x, k: int):
    """x's last dim cut into k equal blocks (views)."""
    size = x.shape[-1] // k
    return [x[..., j * size:(j + 1) * size] for j in range(k)]


def _stack(steps: list):
    """Per-step tensors (in time order) as one (T, ...) tensor."""
    return F.stack(steps, axis=0)


def _outer_sum(a, b):
    """Σ over steps and rows of aᵀ·b for a (T, N, A) and b (T, N, B): one (A, B) product."""
    return F.matmul(F.reshape(a, shape=[-1, a.shape[-1]]).T, F.reshape(b, shape=[-1, b.shape[-1]]))


# -- LSTM ------------------------------------------------------------------------------------------------------------


@op("lstm_layer(Tensor<floating> gx, Tensor<floating> h0, Tensor<floating> c0, Tensor<floating> w_hh, "
    "nograd Tensor<int64>? batch_sizes=None, *, bool reverse=False) -> (Tensor y, Tensor cells, Tensor gates)",
    traits=["same_dtype"])
def lstm_layer(gx, h0, c0, w_hh, batch_sizes, *, reverse):
    """One LSTM layer and direction over a sequence, torch's cell: from the input projection ``gx`` (T, N, 4H) =
    x·W_ihᵀ + b_ih + b_hh, gates i, f, g, o = σ, σ, tanh, σ of gx[t] + h·W_hhᵀ, then c = f·c + i·g,
    h = o·tanh(c). Returns y (T, N, H): h every step; ``cells`` (T, N, H): c every step; ``gates`` (T, N, 4H):
    the activated gates (what the backward pass reads). ``reverse`` runs from the last step to the first.
    ``batch_sizes`` (T,): how many rows (the first ones) take part in each step; the others keep their state
    (see the module's notes). The last state is y[-1], cells[-1] (y[0], cells[0] when reverse)."""
    _validate(lstm_layer, gx, h0, c0, w_hh, batch_sizes, reverse=reverse)
    t, n, four_h = gx.shape
    h = four_h // 4
    sizes = _sizes("lstm_layer", batch_sizes, t, n)
    y, cells, gates = np.empty((t, n, h), gx.dtype), np.empty((t, n, h), gx.dtype), np.empty_like(gx)
    scale, shift = _gate_rows(gx.dtype, n, h, [True, True, False, True])
    product = _StepProduct(w_hh.T, n, _StepProduct.FORWARD)  # h·W_hhᵀ
    h_prev, c_prev = np.asarray(h0), np.asarray(c0)
    zero_start = not h_prev.any()  # the default initial state: the first step's product is zero
    ig = np.empty((n, h), gx.dtype)
    for step in _steps(t, reverse):
        b = _active(sizes, step, n)
        g = gates[step, :b]
        if zero_start:
            np.copyto(g, gx[step, :b])
            zero_start = False
        else:
            product(h_prev[:b], g, add=gx[step, :b])
        g *= scale[:b]  # the gate block in one tanh: σ(x) = 0.5·tanh(x/2) + 0.5 for i, f and o
        np.tanh(g, out=g)
        g *= scale[:b]
        g += shift[:b]
        i, f, gg, o = g[:, :h], g[:, h:2 * h], g[:, 2 * h:3 * h], g[:, 3 * h:]
        c, hy = cells[step], y[step]
        np.multiply(f, c_prev[:b], out=c[:b])
        np.multiply(i, gg, out=ig[:b])
        c[:b] += ig[:b]
        np.tanh(c[:b], out=hy[:b])
        hy[:b] *= o
        if b < n:  # rows past their length keep their state
            gates[step, b:] = 0
            c[b:], hy[b:] = c_prev[b:], h_prev[b:]
        h_prev, c_prev = hy, c
    return y, cells, gates


@lstm_layer.infer
def _(gx, h0, c0, w_hh, batch_sizes, *, reverse):
    t, n, h = _sequence_dims("lstm_layer", gx, w_hh, 4)
    _check_shape("lstm_layer", "h0", h0, (n, h))
    _check_shape("lstm_layer", "c0", c0, (n, h))
    _check_batch_sizes("lstm_layer", batch_sizes, t)
    return Spec((t, n, h), gx.dtype), Spec((t, n, h), gx.dtype), Spec(gx.shape, gx.dtype)


@lstm_layer.grad
def _(h0, c0, w_hh, batch_sizes, y, cells, gates, dy=None, dcells=None, dgates=None, *, reverse, needs_input_grad):
    # an output no gradient reached comes as None (the usual case: nothing reads cells and gates), not as zeros
    dpre, dh0, dc0 = F.lstm_layer_grad(gates, cells, c0, w_hh, dy, dcells, dgates, batch_sizes, reverse=reverse)
    # the weight's gradient: Σ over steps of dpreᵀ·h_prev, one product (rows past their length have dpre 0)
    dw = _outer_sum(dpre, _previous(y, h0, reverse)) if needs_input_grad[3] else None
    return dpre, dh0, dc0, dw, None


def _lstm_sample(rng, t, n, h, batch_sizes=None, reverse=False):
    sizes = None if batch_sizes is None else np.array(batch_sizes, np.int64)
    return Sample.of(rng.standard_normal((t, n, 4 * h)), rng.standard_normal((n, h)), rng.standard_normal((n, h)),
                     rng.standard_normal((4 * h, h)) * 0.5, sizes, reverse=reverse)


@lstm_layer.samples
def _(rng):
    yield _lstm_sample(rng, 3, 2, 2)
    yield _lstm_sample(rng, 3, 3, 2, reverse=True)
    yield _lstm_sample(rng, 4, 3, 2, batch_sizes=[3, 2, 2, 1])
    yield _lstm_sample(rng, 3, 3, 1, batch_sizes=[3, 2, 1], reverse=True)
    yield _lstm_sample(rng, 1, 2, 3)


@op("lstm_layer_grad(Tensor<floating> gates, Tensor<floating> cells, Tensor<floating> c0, Tensor<floating> w_hh, "
    "Tensor<floating>? dy=None, Tensor<floating>? dcells=None, Tensor<floating>? dgates=None, "
    "nograd Tensor<int64>? batch_sizes=None, *, bool reverse=False) -> (Tensor dpre, Tensor dh0, Tensor dc0)",
    traits=["same_dtype"])
def lstm_layer_grad(gates, cells, c0, w_hh, dy, dcells, dgates, batch_sizes, *, reverse):
    """Backpropagation through time of ``lstm_layer``, from its outputs ``gates`` and ``cells`` (and c0, w_hh):
    given the gradients of y, cells and gates (None: zero, no gradient reached that output), the gradient of the
    gates' pre-activations every step ``dpre`` (T, N, 4H) — which is gx's, and from which the layer's rule makes
    W_hh's as one product — and those of h0 and c0. One dpre·W_hh product a step."""
    _validate(lstm_layer_grad, gates, cells, c0, w_hh, dy, dcells, dgates, batch_sizes, reverse=reverse)
    t, n, h = cells.shape
    sizes = _sizes("lstm_layer_grad", batch_sizes, t, n)
    dh, dc = np.zeros((n, h), gates.dtype), np.zeros((n, h), gates.dtype)
    product = _StepProduct(w_hh, n, _StepProduct.BACKWARD)
    order = list(_steps(t, reverse))
    # What does not depend on the recursion, for every step at once (a few passes over whole arrays, not a few
    # small ones a step): the activations' derivatives J — σ(1 − σ) for i, f, o and 1 − g² — in dpre, which each
    # step then multiplies by its a in place; with k = tanh(c), k and o·(1 − k²).
    dpre = np.subtract(1, gates)
    dpre *= gates
    jac_g = dpre[..., 2 * h:3 * h]
    np.multiply(gates[..., 2 * h:3 * h], gates[..., 2 * h:3 * h], out=jac_g)
    np.subtract(1, jac_g, out=jac_g)
    k_all = np.tanh(cells)
    o_k = np.multiply(k_all, k_all)
    np.subtract(1, o_k, out=o_k)
    o_k *= gates[..., 3 * h:]
    a_buf, d_buf = np.empty((n, 4 * h), gates.dtype), np.empty((n, h), gates.dtype)
    for k, step in enumerate(reversed(order)):
        if dy is not None:
            dh += dy[step]
        if dcells is not None:
            dc += dcells[step]
        b = _active(sizes, step, n)
        g, p, a, dhb = gates[step, :b], dpre[step], a_buf[:b], dh[:b]
        i, f, gg = g[:, :h], g[:, h:2 * h], g[:, 2 * h:3 * h]
        c_prev = (c0 if k == t - 1 else cells[order[t - 2 - k]])[:b]
        db = np.multiply(o_k[step, :b], dhb, out=d_buf[:b])  # D = dc + dh·o·(1 − k²)
        db += dc[:b]
        np.multiply(db, gg, out=a[:, :h])  # ∂/∂i, ∂/∂f, ∂/∂g, ∂/∂o, then through the activations
        np.multiply(db, c_prev, out=a[:, h:2 * h])
        np.multiply(db, i, out=a[:, 2 * h:3 * h])
        np.multiply(dhb, k_all[step, :b], out=a[:, 3 * h:])
        if dgates is not None:
            a += dgates[step, :b]
        p[:b] *= a
        if b < n:
            p[b:] = 0
        np.multiply(db, f, out=dc[:b])
        product(p[:b], dhb)
    return dpre, dh, dc


@lstm_layer_grad.infer
def _(gates, cells, c0, w_hh, dy, dcells, dgates, batch_sizes, *, reverse):
    if len(cells.shape) != 3:
        raise ShapeError(f"lstm_layer_grad(): cells must be 3-D (T, N, H), got shape {cells.shape}")
    t, n, h = cells.shape
    four_h = None if h is None else 4 * h
    for name, spec, shape in (("gates", gates, (t, n, four_h)), ("c0", c0, (n, h)), ("w_hh", w_hh, (four_h, h)),
                              ("dy", dy, (t, n, h)), ("dcells", dcells, (t, n, h)),
                              ("dgates", dgates, (t, n, four_h))):
        _check_shape("lstm_layer_grad", name, spec, shape)
    _check_batch_sizes("lstm_layer_grad", batch_sizes, t)
    return Spec(gates.shape, gates.dtype), Spec((n, h), gates.dtype), Spec((n, h), gates.dtype)


@lstm_layer_grad.grad
def _(gates, cells, c0, w_hh, dy, dcells, dgates, batch_sizes, dpre, ddpre, ddh0, ddc0, *, reverse):
    # The backward pass, per step s (visited last to first; D the gradient of c, a the gates' before their
    # activations' derivatives J, p = a·J = dpre):
    #   dh += dy;  dc += dcells;  D = dc + dh·o·(1 − k²)  (k = tanh c)
    #   a = (D·g, D·c_prev, D·i, dh·k) + dgates;  p = a·J;  dc = D·f;  dh = p·W_hh          (rows taking part)
    # It is linear in (dy, dcells, dgates): its gradient there is the same recursion run forwards from the incoming
    # (ddh0, ddc0, ddpre), η for dh and κ for dc (the tangent of the forward pass); in the coefficients (gates,
    # cells, c0, W_hh) it is a product of both sweeps' values at each step. Ops only: differentiable again.
    t, n = cells.shape[:2]
    given = dy is not None, dcells is not None, dgates is not None  # an absent one is zero and gets no gradient
    dy, dcells = (F.zeros_like(cells) if v is None else v for v in (dy, dcells))
    dgates = F.zeros_like(gates) if dgates is None else dgates
    mask = _masks(batch_sizes, n, gates.dtype)
    order = list(_steps(t, reverse))
    i_all, f_all, g_all, o_all = _blocks(gates, 4)
    k_all = F.tanh(cells)
    jac_all = F.concat([i_all * (1 - i_all), f_all * (1 - f_all), 1 - g_all * g_all, o_all * (1 - o_all)], axis=2)

    def c_prev(s):
        return c0 if s == 0 else cells[order[s - 1]]

    # the backward pass again, for the dh and D of every step
    dh_at, d_at = [None] * t, [None] * t
    dh = dc = None
    for s in range(t - 1, -1, -1):
        step = order[s]
        dh = dy[step] if dh is None else dh + dy[step]
        dc = dcells[step] if dc is None else dc + dcells[step]
        k = k_all[step]
        d = dc + dh * o_all[step] * (1 - k * k)
        dh_at[s], d_at[s] = dh, d
        new_dc, new_dh = d * f_all[step], F.matmul(dpre[step], w_hh)  # both 0 in rows not taking part (gates 0)
        dc, dh = (new_dc, new_dh) if mask is None else (new_dc + (1 - mask[step]) * dc,
                                                        new_dh + (1 - mask[step]) * dh)
    # forwards: the tangents, and the gradients in the coefficients
    eta, kappa = ddh0, ddc0
    g_gates, g_cells, g_dy, g_dcells, g_dgates, etas = ([None] * t for _ in range(6))
    g_c0 = None
    for s in range(t):
        step = order[s]
        m = None if mask is None else mask[step]
        i, f, g, o, k = i_all[step], f_all[step], g_all[step], o_all[step], k_all[step]
        dh, d, cp = dh_at[s], d_at[s], c_prev(s)
        etas[step] = eta
        q = ddpre[step] + F.matmul(eta, w_hh.T)  # the gradient reaching p
        sig = q * jac_all[step]
        if m is not None:
            sig = sig * m
        s_i, s_f, s_g, s_o = _blocks(sig, 4)
        a = F.concat([d * g, d * cp, d * i, dh * k], axis=1) + dgates[step]
        q_a = q * a
        if m is not None:
            q_a = q_a * m
        qa_i, qa_f, qa_g, qa_o = _blocks(q_a, 4)
        dd = kappa * f + s_i * g + s_f * cp + s_g * i  # the gradient reaching D
        one_k2 = 1 - k * k
        # those reaching the coefficients i, f, g, o, k = tanh(c) and c_prev
        cot_i = qa_i * (1 - 2 * i) + s_g * d
        cot_f = qa_f * (1 - 2 * f) + kappa * d
        cot_g = -2 * qa_g * g + s_i * d
        cot_o = qa_o * (1 - 2 * o) + dd * dh * one_k2
        cot_k = s_o * dh - 2 * dd * dh * o * k
        g_cp = s_f * d
        grad_gates = F.concat([cot_i, cot_f, cot_g, cot_o], axis=1)
        g_gates[step] = grad_gates if m is None else grad_gates * m
        g_k = cot_k * one_k2
        g_cells[step] = g_k if m is None else g_k * m
        if s == 0:
            g_c0 = g_cp
        else:  # c_prev is the previous step's cells
            prev = order[s - 1]
            g_cells[prev] = g_cells[prev] + g_cp
        new_eta = s_o * k + dd * o * one_k2
        if m is not None:
            new_eta = new_eta + (1 - m) * eta
            dd = dd + (1 - m) * kappa
        eta, kappa = new_eta, dd
        g_dy[step], g_dcells[step], g_dgates[step] = eta, kappa, sig
    g_w = _outer_sum(dpre, _stack(etas))  # from dh = p·W_hh: Σ pᵀ·η
    g_dy, g_dcells, g_dgates = (_stack(g) if want else None for g, want in zip((g_dy, g_dcells, g_dgates), given))
    return _stack(g_gates), _stack(g_cells), g_c0, g_w, g_dy, g_dcells, g_dgates, None


def _lstm_grad_sample(rng, t, n, h, batch_sizes=None, reverse=False, absent=()):
    gates = np.concatenate([rng.uniform(0.1, 0.9, (t, n, 2 * h)), rng.uniform(-0.9, 0.9, (t, n, h)),
                            rng.uniform(0.1, 0.9, (t, n, h))], axis=2)
    sizes = None
    if batch_sizes is not None:
        sizes = np.array(batch_sizes, np.int64)
        gates[np.arange(n)[None, :] >= sizes[:, None]] = 0  # rows past their length: gates 0, as lstm_layer's
    grads = {"dy": rng.standard_normal((t, n, h)), "dcells": rng.standard_normal((t, n, h)),
             "dgates": rng.standard_normal((t, n, 4 * h))}
    return Sample.of(gates, rng.standard_normal((t, n, h)), rng.standard_normal((n, h)),
                     rng.standard_normal((4 * h, h)) * 0.5, *(None if k in absent else g for k, g in grads.items()),
                     sizes, reverse=reverse)


@lstm_layer_grad.samples
def _(rng):
    yield _lstm_grad_sample(rng, 2, 2, 2)
    yield _lstm_grad_sample(rng, 3, 2, 1, batch_sizes=[2, 1, 1])
    yield _lstm_grad_sample(rng, 3, 2, 1, batch_sizes=[2, 2, 1], reverse=True)
    yield _lstm_grad_sample(rng, 3, 2, 2, absent=("dcells", "dgates"))  # as the layer's rule calls it, usually
    yield _lstm_grad_sample(rng, 2, 2, 2, batch_sizes=[2, 1], absent=("dy", "dgates"))  # only c_n read


# -- GRU -------------------------------------------------------------------------------------------------------------


@op("gru_layer(Tensor<floating> gx, Tensor<floating> h0, Tensor<floating> w_hh, Tensor<floating>? b_hh=None, "
    "nograd Tensor<int64>? batch_sizes=None, *, bool reverse=False) -> (Tensor y, Tensor gates, Tensor hn)",
    traits=["same_dtype"])
def gru_layer(gx, h0, w_hh, b_hh, batch_sizes, *, reverse):
    """One GRU layer and direction over a sequence, torch's cell: from the input projection ``gx`` (T, N, 3H) =
    x·W_ihᵀ + b_ih and gh = h·W_hhᵀ + b_hh, r = σ(gx_r + gh_r), z = σ(gx_z + gh_z), n = tanh(gx_n + r·gh_n),
    h = n + z·(h − n). Returns y (T, N, H): h every step; ``gates`` (T, N, 3H): r, z, n; ``hn`` (T, N, H): gh_n
    (what the backward pass reads). ``reverse`` and ``batch_sizes`` as lstm_layer's. The last state is y[-1]
    (y[0] when reverse)."""
    _validate(gru_layer, gx, h0, w_hh, b_hh, batch_sizes, reverse=reverse)
    t, n, three_h = gx.shape
    h = three_h // 3
    sizes = _sizes("gru_layer", batch_sizes, t, n)
    y, gates, hn = np.empty((t, n, h), gx.dtype), np.empty_like(gx), np.empty((t, n, h), gx.dtype)
    product = _StepProduct(w_hh.T, n, _StepProduct.FORWARD)  # h·W_hhᵀ
    gh = np.empty((n, three_h), gx.dtype)
    h_prev = np.asarray(h0)
    zero_start = not h_prev.any()  # the default initial state: the first step's product is zero
    for step in _steps(t, reverse):
        b = _active(sizes, step, n)
        ghb = gh[:b]
        if zero_start:
            ghb[...] = 0
            zero_start = False
        else:
            product(h_prev[:b], ghb)
        if b_hh is not None:
            ghb += b_hh
        g = gates[step, :b]
        rz, nn = g[:, :2 * h], g[:, 2 * h:]
        np.add(gx[step, :b, :2 * h], ghb[:, :2 * h], out=rz)
        rz *= 0.5  # σ(x) = 0.5·tanh(x/2) + 0.5
        np.tanh(rz, out=rz)
        rz *= 0.5
        rz += 0.5
        hn[step, :b] = ghb[:, 2 * h:]
        np.multiply(g[:, :h], ghb[:, 2 * h:], out=nn)
        nn += gx[step, :b, 2 * h:]
        np.tanh(nn, out=nn)
        hy = y[step]
        np.subtract(h_prev[:b], nn, out=hy[:b])  # torch's order: (h − n)·z + n
        hy[:b] *= g[:, h:2 * h]
        hy[:b] += nn
        if b < n:
            gates[step, b:], hn[step, b:], hy[b:] = 0, 0, h_prev[b:]
        h_prev = hy
    return y, gates, hn


@gru_layer.infer
def _(gx, h0, w_hh, b_hh, batch_sizes, *, reverse):
    t, n, h = _sequence_dims("gru_layer", gx, w_hh, 3)
    _check_shape("gru_layer", "h0", h0, (n, h))
    _check_shape("gru_layer", "b_hh", b_hh, (None if h is None else 3 * h,))
    _check_batch_sizes("gru_layer", batch_sizes, t)
    return Spec((t, n, h), gx.dtype), Spec(gx.shape, gx.dtype), Spec((t, n, h), gx.dtype)


@gru_layer.grad
def _(h0, w_hh, batch_sizes, y, gates, hn, dy=None, dgates=None, dhn=None, *, reverse, needs_input_grad):
    # an output no gradient reached comes as None (the usual case: nothing reads gates and hn), not as zeros
    dgx, dgh, dh0 = F.gru_layer_grad(gates, hn, y, h0, w_hh, dy, dgates, dhn, batch_sizes, reverse=reverse)
    dw = _outer_sum(dgh, _previous(y, h0, reverse)) if needs_input_grad[2] else None
    db = F.sum(dgh, axis=[0, 1]) if needs_input_grad[3] else None
    return dgx, dh0, dw, db, None


def _gru_sample(rng, t, n, h, batch_sizes=None, reverse=False, bias=True):
    sizes = None if batch_sizes is None else np.array(batch_sizes, np.int64)
    return Sample.of(rng.standard_normal((t, n, 3 * h)), rng.standard_normal((n, h)),
                     rng.standard_normal((3 * h, h)) * 0.5, rng.standard_normal(3 * h) if bias else None, sizes,
                     reverse=reverse)


@gru_layer.samples
def _(rng):
    yield _gru_sample(rng, 3, 2, 2)
    yield _gru_sample(rng, 3, 3, 2, reverse=True, bias=False)
    yield _gru_sample(rng, 4, 3, 2, batch_sizes=[3, 2, 2, 1])
    yield _gru_sample(rng, 3, 3, 1, batch_sizes=[3, 2, 1], reverse=True)
    yield _gru_sample(rng, 1, 2, 3)


@op("gru_layer_grad(Tensor<floating> gates, Tensor<floating> hn, Tensor<floating> y, Tensor<floating> h0, "
    "Tensor<floating> w_hh, Tensor<floating>? dy=None, Tensor<floating>? dgates=None, Tensor<floating>? dhn=None, "
    "nograd Tensor<int64>? batch_sizes=None, *, bool reverse=False) -> (Tensor dgx, Tensor dgh, Tensor dh0)",
    traits=["same_dtype"])
def gru_layer_grad(gates, hn, y, h0, w_hh, dy, dgates, dhn, batch_sizes, *, reverse):
    """Backpropagation through time of ``gru_layer``, from its outputs ``gates``, ``hn`` and ``y`` (and h0, w_hh):
    given the gradients of y, gates and hn (None: zero), the gradients of gx (T, N, 3H) and of gh = h·W_hhᵀ +
    b_hh every step (they differ in the n block: r·dgx_n there), from which the layer's rule makes W_hh's and
    b_hh's as one product and one sum, and h0's. One dgh·W_hh product a step."""
    _validate(gru_layer_grad, gates, hn, y, h0, w_hh, dy, dgates, dhn, batch_sizes, reverse=reverse)
    t, n, h = y.shape
    sizes = _sizes("gru_layer_grad", batch_sizes, t, n)
    dgx, dgh = np.empty_like(gates), np.empty_like(gates)
    dh = np.zeros((n, h), gates.dtype)
    product = _StepProduct(w_hh, n, _StepProduct.BACKWARD)
    order = list(_steps(t, reverse))
    # As lstm_layer_grad: the activations' derivatives r(1 − r), z(1 − z), 1 − n² for every step at once in dgx,
    # which each step multiplies by its a in place; and 1 − z.
    r_all, z_all, n_all = gates[..., :h], gates[..., h:2 * h], gates[..., 2 * h:]
    one_z = np.subtract(1, z_all)
    np.subtract(1, r_all, out=dgx[..., :h])
    dgx[..., :h] *= r_all
    np.multiply(one_z, z_all, out=dgx[..., h:2 * h])
    np.multiply(n_all, n_all, out=dgx[..., 2 * h:])
    np.subtract(1, dgx[..., 2 * h:], out=dgx[..., 2 * h:])
    a_buf, rec = np.empty((n, h), gates.dtype), np.empty((n, h), gates.dtype)
    for k, step in enumerate(reversed(order)):
        if dy is not None:
            dh += dy[step]
        b = _active(sizes, step, n)
        r, z, nn = r_all[step, :b], z_all[step, :b], n_all[step, :b]
        h_prev = (h0 if k == t - 1 else y[order[t - 2 - k]])[:b]
        x, hh, dhb, a = dgx[step], dgh[step], dh[:b], a_buf[:b]
        d_r, d_z, d_n = x[:b, :h], x[:b, h:2 * h], x[:b, 2 * h:]
        np.multiply(one_z[step, :b], dhb, out=a)  # n: (dh·(1 − z) + dgates_n)·(1 − n²)
        if dgates is not None:
            a += dgates[step, :b, 2 * h:]
        d_n *= a
        np.subtract(h_prev, nn, out=a)  # z: (dh·(h_prev − n) + dgates_z)·z(1 − z)
        a *= dhb
        if dgates is not None:
            a += dgates[step, :b, h:2 * h]
        d_z *= a
        np.multiply(d_n, hn[step, :b], out=a)  # r: (d_n·hn + dgates_r)·r(1 − r)
        if dgates is not None:
            a += dgates[step, :b, :h]
        d_r *= a
        hh[:b, :2 * h] = x[:b, :2 * h]
        np.multiply(d_n, r, out=hh[:b, 2 * h:])
        if dhn is not None:
            hh[:b, 2 * h:] += dhn[step, :b]
        if b < n:
            x[b:], hh[b:] = 0, 0
        dhb *= z
        dhb += product(hh[:b], rec[:b])
    return dgx, dgh, dh


@gru_layer_grad.infer
def _(gates, hn, y, h0, w_hh, dy, dgates, dhn, batch_sizes, *, reverse):
    if len(y.shape) != 3:
        raise ShapeError(f"gru_layer_grad(): y must be 3-D (T, N, H), got shape {y.shape}")
    t, n, h = y.shape
    three_h = None if h is None else 3 * h
    for name, spec, shape in (("gates", gates, (t, n, three_h)), ("hn", hn, (t, n, h)), ("h0", h0, (n, h)),
                              ("w_hh", w_hh, (three_h, h)), ("dy", dy, (t, n, h)),
                              ("dgates", dgates, (t, n, three_h)), ("dhn", dhn, (t, n, h))):
        _check_shape("gru_layer_grad", name, spec, shape)
    _check_batch_sizes("gru_layer_grad", batch_sizes, t)
    return Spec(gates.shape, gates.dtype), Spec(gates.shape, gates.dtype), Spec((n, h), gates.dtype)


@gru_layer_grad.grad
def _(gates, hn, y, h0, w_hh, dy, dgates, dhn, batch_sizes, dgx, dgh, ddgx, ddgh, ddh0, *, reverse):
    # The backward pass, per step (visited last to first; hp = h_prev):
    #   dh += dy;  a_z = dh·(hp − n) + dgates_z;  a_n = dh·(1 − z) + dgates_n;  dn = a_n·(1 − n²)
    #   a_r = dn·hn + dgates_r;  dgx = (a_r·r(1 − r), a_z·z(1 − z), dn);  dgh = dgx with dn·r + dhn for n
    #   dh = dh·z + dgh·W_hh                                                                 (rows taking part)
    # Linear in (dy, dgates, dhn): as lstm_layer_grad's rule, the recursion forwards (η for dh) and products of
    # both sweeps' values for the coefficients.
    t, n, h = y.shape
    given = dy is not None, dgates is not None, dhn is not None  # an absent one is zero and gets no gradient
    dy, dhn = (F.zeros_like(y) if v is None else v for v in (dy, dhn))
    dgates = F.zeros_like(gates) if dgates is None else dgates
    mask = _masks(batch_sizes, n, gates.dtype)
    order = list(_steps(t, reverse))
    r_all, z_all, n_all = _blocks(gates, 3)

    def h_prev(s):
        return h0 if s == 0 else y[order[s - 1]]

    dh_at, dh = [None] * t, None
    for s in range(t - 1, -1, -1):
        step = order[s]
        dh = dy[step] if dh is None else dh + dy[step]
        dh_at[s] = dh
        new_dh = dh * z_all[step] + F.matmul(dgh[step], w_hh)  # z and dgh are 0 in rows not taking part
        dh = new_dh if mask is None else new_dh + (1 - mask[step]) * dh
    eta = ddh0
    g_gates, g_hn, g_y, g_dy, g_dgates, g_dhn, etas = ([None] * t for _ in range(7))
    g_h0 = None
    for s in range(t):
        step = order[s]
        m = None if mask is None else mask[step]
        r, z, nn, ghn = r_all[step], z_all[step], n_all[step], hn[step]
        dh, hp = dh_at[s], h_prev(s)
        etas[step] = eta
        q_r, q_z, q_n = _blocks(ddgh[step] + F.matmul(eta, w_hh.T), 3)  # the gradients reaching dgh
        x_r, x_z, x_n = _blocks(ddgx[step], 3)  # and dgx
        a_z = dh * (hp - nn) + dgates[step][:, h:2 * h]
        a_n = dh * (1 - z) + dgates[step][:, 2 * h:]
        d_n = a_n * (1 - nn * nn)
        a_r = d_n * ghn + dgates[step][:, :h]
        c_r, c_z = x_r + q_r, x_z + q_z  # the gradients reaching d_r, d_z
        if m is not None:
            c_r, c_z, q_n, x_n = c_r * m, c_z * m, q_n * m, x_n * m
        s_r, s_z = c_r * r * (1 - r), c_z * z * (1 - z)  # those reaching a_r, a_z
        c_n = q_n * r + x_n + s_r * ghn  # the gradient reaching d_n
        s_n = c_n * (1 - nn * nn)  # that reaching a_n
        cot_r = q_n * d_n + c_r * a_r * (1 - 2 * r)
        cot_z = eta * dh + c_z * a_z * (1 - 2 * z) - s_n * dh
        cot_n = -2 * c_n * a_n * nn - s_z * dh
        g_gates[step] = F.concat([cot_r, cot_z if m is None else cot_z * m, cot_n], axis=1)
        g_hn[step] = s_r * d_n
        g_hp = s_z * dh
        if s == 0:
            g_h0 = g_hp
        else:
            g_y[order[s - 1]] = g_hp
        new_eta = eta * z + s_n * (1 - z) + s_z * (hp - nn)
        eta = new_eta if m is None else new_eta * m + (1 - m) * eta
        g_dy[step], g_dgates[step], g_dhn[step] = eta, F.concat([s_r, s_z, s_n], axis=1), q_n
    g_y[order[t - 1]] = F.zeros_like(y[0])  # the last step's y is no step's h_prev
    g_w = _outer_sum(dgh, _stack(etas))  # from dh = dgh·W_hh: Σ dghᵀ·η
    g_dy, g_dgates, g_dhn = (_stack(g) if want else None for g, want in zip((g_dy, g_dgates, g_dhn), given))
    return _stack(g_gates), _stack(g_hn), _stack(g_y), g_h0, g_w, g_dy, g_dgates, g_dhn, None


def _gru_grad_sample(rng, t, n, h, batch_sizes=None, reverse=False, absent=()):
    gates = np.concatenate([rng.uniform(0.1, 0.9, (t, n, 2 * h)), rng.uniform(-0.9, 0.9, (t, n, h))], axis=2)
    sizes = None
    if batch_sizes is not None:
        sizes = np.array(batch_sizes, np.int64)
        gates[np.arange(n)[None, :] >= sizes[:, None]] = 0
    grads = {"dy": rng.standard_normal((t, n, h)), "dgates": rng.standard_normal((t, n, 3 * h)),
             "dhn": rng.standard_normal((t, n, h))}
    return Sample.of(gates, rng.standard_normal((t, n, h)), rng.standard_normal((t, n, h)),
                     rng.standard_normal((n, h)), rng.standard_normal((3 * h, h)) * 0.5,
                     *(None if k in absent else g for k, g in grads.items()), sizes, reverse=reverse)


@gru_layer_grad.samples
def _(rng):
    yield _gru_grad_sample(rng, 2, 2, 2)
    yield _gru_grad_sample(rng, 3, 2, 1, batch_sizes=[2, 1, 1])
    yield _gru_grad_sample(rng, 3, 2, 1, batch_sizes=[2, 2, 1], reverse=True)
    yield _gru_grad_sample(rng, 3, 2, 2, absent=("dgates", "dhn"))  # as the layer's rule calls it, usually
    yield _gru_grad_sample(rng, 2, 2, 2, reverse=True, absent=("dy", "dhn"))


__all__ = ["gru_layer", "gru_layer_grad", "lstm_layer", "lstm_layer_grad"]


# -- ONNX export ------------------------------------------------------------------------------------------------------
# The outputs y alone (inference): one ONNX LSTM/GRU node, its weights' gate blocks in ONNX's order. Where gx is the
# layer's input projection (linear: x·W_ihᵀ + b), the node takes x, W_ih and b itself; any other gx is its input
# through a permutation matrix. What the backward pass reads (every step's cell states, the gates) ONNX's nodes do not
# give: where the model reads them, the steps are written out with the kernel's math, one block of nodes a step (the
# number of steps must then be known).

_ONNX_ORDER = {"LSTM": [0, 3, 1, 2], "GRU": [1, 0, 2]}  # ONNX's gate blocks (i, o, f, c; z, r, h) in ours


def _onnx_gate_rows(kind: str, h: int) -> np.ndarray:
    return np.concatenate([np.arange(b * h, (b + 1) * h) for b in _ONNX_ORDER[kind]])


def _onnx_valid(g, batch_sizes, gx):
    """(T, N, 1) bool: which rows take part in each step."""
    i64 = np.dtype(np.int64)
    rows = g.op("Range", g.const(np.array(0, np.int64)), g.op("Squeeze", g.op("Shape", gx, start=1, end=2),
                                                                 g.ints([0])), g.const(np.array(1, np.int64)),
                spec=Spec((gx.shape[1],), i64))
    valid = g.op("Less", g.op("Unsqueeze", rows, g.ints([0])), g.op("Unsqueeze", batch_sizes, g.ints([1])))
    return g.op("Unsqueeze", valid, g.ints([2]), spec=Spec((gx.shape[0], gx.shape[1], 1), np.dtype(bool)))


def _onnx_sequence_node(g, kind, gx, h0, c0, w_hh, b_hh, batch_sizes, reverse):
    h = w_hh.shape[1]
    if h is None:
        raise g.unsupported(f"a hidden size known only at run time (w_hh {w_hh.shape})")
    gates = len(_ONNX_ORDER[kind])
    rows = g.const(_onnx_gate_rows(kind, h))
    dtype = gx.dtype

    def per_gate(v):  # ONNX's (1, gates·H, ...) layout, its blocks in ONNX's order
        return g.op("Unsqueeze", g.op("Gather", g.cast(v, dtype), rows, axis=0), g.ints([0]))

    source = g.source(gx)
    if source is not None and source[0] == "linear" and source[1][0].ndim == 3 and source[1][1].ndim == 2:
        # gx = x·W_ihᵀ + b, the input projection: the node takes x and W_ih itself (its nodes fall away)
        x, w_ih, b_ih = source[1]
        x, w, wb = g.cast(x, dtype), per_gate(w_ih), None if b_ih is None else per_gate(b_ih)
    else:  # any other gx: the node's input weights are the permutation that reorders its gate blocks
        x, w, wb = gx, g.const(np.eye(gates * h, dtype=dtype)[_onnx_gate_rows(kind, h)][None]), None
    r = per_gate(w_hh)
    rb = None if b_hh is None else per_gate(b_hh)  # GRU: inside r·(h·W_hnᵀ + b_hn), as torch (linear_before_reset)
    b = None
    if wb is not None or rb is not None:
        zeros = g.const(np.zeros((1, gates * h), dtype))
        b = g.op("Concat", wb or zeros, rb or zeros, axis=1)
    lens = valid = None
    if batch_sizes is not None:
        valid = _onnx_valid(g, batch_sizes, gx)
        lens = g.cast(g.reduce("ReduceSum", g.cast(valid, np.dtype(np.int64)), [0, 2], False), np.dtype(np.int32))
    states = [g.op("Unsqueeze", s, g.ints([0])) for s in ((h0, c0) if kind == "LSTM" else (h0,))]
    extra = {"linear_before_reset": 1} if kind == "GRU" else {}
    outs = g.op(kind, x, w, r, b, lens, *states, hidden_size=h, direction="reverse" if reverse else "forward",
                outputs=2, **extra)
    y = g.op("Squeeze", outs[0], g.ints([1]), spec=g.outputs[0])
    if valid is None:
        return y
    # past its length ONNX writes zeros; our rows keep their state: the last (forward) or the initial one (reverse;
    # also a row of length 0, whose last state ONNX gives as zeros)
    kept = h0
    if not reverse:
        started = g.op("Unsqueeze", g.op("Greater", lens, g.const(np.array(0, np.int32))), g.ints([1]))
        kept = g.op("Where", started, g.op("Squeeze", outs[1], g.ints([0])), h0)
    return g.op("Where", valid, y, kept, spec=g.outputs[0])


def _onnx_steps(g, kind, gx, h0, c0, w_hh, b_hh, batch_sizes, reverse):
    """Every step written out, as the kernel computes it: (y, cells, gates) of an LSTM, (y, gates, hn) of a GRU."""
    t, n, width = gx.shape
    if t is None:
        raise g.unsupported(f"{kind}'s states of every step (what its backward pass reads) over a number of steps "
                            "known only at run time; a model that reads only the outputs y is written as one "
                            f"ONNX {kind} node")
    h = width // (4 if kind == "LSTM" else 3)
    valid = None if batch_sizes is None else _onnx_valid(g, batch_sizes, gx)
    w_t = g.op("Transpose", w_hh, perm=[1, 0])
    zero = g.scalar(0, gx)
    step_spec = Spec((n, width), gx.dtype)
    state_spec = Spec((n, h), gx.dtype)
    ys, cs, gs, hs = [None] * t, [None] * t, [None] * t, [None] * t
    h_prev, c_prev = h0, c0

    def block(x, j):
        return g.op("Slice", x, g.ints([j * h]), g.ints([(j + 1) * h]), g.ints([1]), spec=state_spec)

    for step in _steps(t, reverse):
        x = g.op("Gather", gx, g.const(np.array(step, np.int64)), axis=0, spec=step_spec)
        m = None if valid is None else g.op("Gather", valid, g.const(np.array(step, np.int64)), axis=0)
        gh = g.op("MatMul", h_prev, w_t, spec=step_spec)
        if kind == "LSTM":
            pre = g.op("Add", gh, x)
            i, f, gg, o = (g.op("Tanh" if j == 2 else "Sigmoid", block(pre, j)) for j in range(4))
            c = g.op("Add", g.op("Mul", f, c_prev), g.op("Mul", i, gg))
            hy = g.op("Mul", g.op("Tanh", c), o)
            act = g.op("Concat", i, f, gg, o, axis=1, spec=step_spec)
            extra = c
        else:
            if b_hh is not None:
                gh = g.op("Add", gh, b_hh)
            r, z = (g.op("Sigmoid", g.op("Add", block(x, j), block(gh, j))) for j in range(2))
            nn = g.op("Tanh", g.op("Add", block(x, 2), g.op("Mul", r, block(gh, 2))))
            hy = g.op("Add", g.op("Mul", g.op("Sub", h_prev, nn), z), nn)
            act = g.op("Concat", r, z, nn, axis=1, spec=step_spec)
            extra = block(gh, 2)
        if m is not None:  # rows past their length keep their state; their gates (and hn) are 0
            hy = g.op("Where", m, hy, h_prev)
            act = g.op("Where", m, act, zero)
            extra = g.op("Where", m, extra, c_prev if kind == "LSTM" else zero)
        ys[step], gs[step] = hy, act
        if kind == "LSTM":
            cs[step] = c_prev = extra
        else:
            hs[step] = extra
        h_prev = hy

    def stacked(values, spec):
        return g.op("Concat", *(g.op("Unsqueeze", v, g.ints([0])) for v in values), axis=0, spec=spec)

    y = stacked(ys, g.outputs[0])
    if kind == "LSTM":
        return y, stacked(cs, g.outputs[1]), stacked(gs, g.outputs[2])
    return y, stacked(gs, g.outputs[1]), stacked(hs, g.outputs[2])


@lstm_layer.onnx
def _(g, gx, h0, c0, w_hh, batch_sizes, *, reverse):
    if any(g.needed[1:]):
        return _onnx_steps(g, "LSTM", gx, h0, c0, w_hh, None, batch_sizes, reverse)
    return _onnx_sequence_node(g, "LSTM", gx, h0, c0, w_hh, None, batch_sizes, reverse), None, None


@gru_layer.onnx
def _(g, gx, h0, w_hh, b_hh, batch_sizes, *, reverse):
    if any(g.needed[1:]):
        return _onnx_steps(g, "GRU", gx, h0, None, w_hh, b_hh, batch_sizes, reverse)
    return _onnx_sequence_node(g, "GRU", gx, h0, None, w_hh, b_hh, batch_sizes, reverse), None, None


# -- the kernels for every other device --------------------------------------------------------------------------------
# The kernels above are the CPU's: written for NumPy's speed (out= buffers, a blocked product, host scratch). These
# serve every other device (CuPy's, the strict test device): the same recursions, step by step in xp, each value
# computed in the CPU kernel's order (the sigmoid as 0.5·tanh(x/2) + 0.5 too), so that a device equals the CPU to
# the last bits a matrix product may round otherwise. batch_sizes is read once, as the CPU kernels read it.


def _lstm_gate_rows(h: int, dtype, xp):
    """(scale, shift) over a gate row (4H) that turn tanh into the sigmoid for i, f and o (see _gate_rows)."""
    columns = xp.arange(4 * h)
    tanh_gate = (columns >= 2 * h) & (columns < 3 * h)
    return xp.where(tanh_gate, 1.0, 0.5).astype(dtype), xp.where(tanh_gate, 0.0, 0.5).astype(dtype)


@lstm_layer.kernel()
def _(gx, h0, c0, w_hh, batch_sizes, *, reverse, xp):
    _validate(lstm_layer, gx, h0, c0, w_hh, batch_sizes, reverse=reverse)
    t, n, four_h = gx.shape
    h = four_h // 4
    sizes = _sizes("lstm_layer", batch_sizes, t, n)
    y, cells, gates = xp.empty((t, n, h), gx.dtype), xp.empty((t, n, h), gx.dtype), xp.zeros_like(gx)
    scale, shift = _lstm_gate_rows(h, gx.dtype, xp)
    h_prev, c_prev = h0, c0
    for step in _steps(t, reverse):
        b = _active(sizes, step, n)
        g = xp.tanh((h_prev[:b] @ w_hh.T + gx[step, :b]) * scale) * scale + shift
        i, f, gg, o = g[:, :h], g[:, h:2 * h], g[:, 2 * h:3 * h], g[:, 3 * h:]
        gates[step, :b] = g
        cells[step, :b] = f * c_prev[:b] + i * gg
        y[step, :b] = xp.tanh(cells[step, :b]) * o
        cells[step, b:], y[step, b:] = c_prev[b:], h_prev[b:]  # rows past their length keep their state
        h_prev, c_prev = y[step], cells[step]
    return y, cells, gates


@lstm_layer_grad.kernel()
def _(gates, cells, c0, w_hh, dy, dcells, dgates, batch_sizes, *, reverse, xp):
    _validate(lstm_layer_grad, gates, cells, c0, w_hh, dy, dcells, dgates, batch_sizes, reverse=reverse)
    t, n, h = cells.shape
    sizes = _sizes("lstm_layer_grad", batch_sizes, t, n)
    dpre = xp.zeros_like(gates)
    dh, dc = xp.zeros((n, h), gates.dtype), xp.zeros((n, h), gates.dtype)
    # an absent output gradient (None) is zero: added as zeros here (the CPU's skips it; adding zeros changes nothing)
    dy, dcells = (xp.zeros_like(cells) if v is None else v for v in (dy, dcells))
    dgates = xp.zeros_like(gates) if dgates is None else dgates
    order = list(_steps(t, reverse))
    for k, step in enumerate(reversed(order)):
        dh += dy[step]
        dc += dcells[step]
        b = _active(sizes, step, n)
        g = gates[step, :b]
        i, f, gg, o = g[:, :h], g[:, h:2 * h], g[:, 2 * h:3 * h], g[:, 3 * h:]
        c_prev = (c0 if k == t - 1 else cells[order[t - 2 - k]])[:b]
        jac = (1 - g) * g
        jac[:, 2 * h:3 * h] = 1 - gg * gg
        kc = xp.tanh(cells[step, :b])
        db = dc[:b] + (1 - kc * kc) * o * dh[:b]
        p = xp.concatenate([db * gg, db * c_prev, db * i, dh[:b] * kc], axis=1)
        dpre[step, :b] = (p + dgates[step, :b]) * jac
        dc[:b] = db * f
        dh[:b] = dpre[step, :b] @ w_hh
    return dpre, dh, dc


@gru_layer.kernel()
def _(gx, h0, w_hh, b_hh, batch_sizes, *, reverse, xp):
    _validate(gru_layer, gx, h0, w_hh, b_hh, batch_sizes, reverse=reverse)
    t, n, three_h = gx.shape
    h = three_h // 3
    sizes = _sizes("gru_layer", batch_sizes, t, n)
    y, gates, hn = xp.empty((t, n, h), gx.dtype), xp.zeros_like(gx), xp.zeros((t, n, h), gx.dtype)
    h_prev = h0
    for step in _steps(t, reverse):
        b = _active(sizes, step, n)
        gh = h_prev[:b] @ w_hh.T
        if b_hh is not None:
            gh += b_hh
        rz = xp.tanh((gx[step, :b, :2 * h] + gh[:, :2 * h]) * 0.5) * 0.5 + 0.5  # σ(x) = 0.5·tanh(x/2) + 0.5
        nn = xp.tanh(rz[:, :h] * gh[:, 2 * h:] + gx[step, :b, 2 * h:])
        gates[step, :b, :2 * h], gates[step, :b, 2 * h:], hn[step, :b] = rz, nn, gh[:, 2 * h:]
        y[step, :b] = (h_prev[:b] - nn) * rz[:, h:] + nn  # torch's order: (h − n)·z + n
        y[step, b:] = h_prev[b:]
        h_prev = y[step]
    return y, gates, hn


@gru_layer_grad.kernel()
def _(gates, hn, y, h0, w_hh, dy, dgates, dhn, batch_sizes, *, reverse, xp):
    _validate(gru_layer_grad, gates, hn, y, h0, w_hh, dy, dgates, dhn, batch_sizes, reverse=reverse)
    t, n, h = y.shape
    sizes = _sizes("gru_layer_grad", batch_sizes, t, n)
    dgx, dgh = xp.zeros_like(gates), xp.zeros_like(gates)
    dh = xp.zeros((n, h), gates.dtype)
    dy, dhn = (xp.zeros_like(y) if v is None else v for v in (dy, dhn))  # absent (None): zero, as lstm_layer_grad's
    dgates = xp.zeros_like(gates) if dgates is None else dgates
    order = list(_steps(t, reverse))
    for k, step in enumerate(reversed(order)):
        dh += dy[step]
        b = _active(sizes, step, n)
        r, z, nn = gates[step, :b, :h], gates[step, :b, h:2 * h], gates[step, :b, 2 * h:]
        h_prev = (h0 if k == t - 1 else y[order[t - 2 - k]])[:b]
        dhb, dg = dh[:b], dgates[step, :b]
        d_n = ((1 - z) * dhb + dg[:, 2 * h:]) * (1 - nn * nn)
        d_z = ((h_prev - nn) * dhb + dg[:, h:2 * h]) * ((1 - z) * z)
        d_r = (d_n * hn[step, :b] + dg[:, :h]) * ((1 - r) * r)
        dgx[step, :b] = xp.concatenate([d_r, d_z, d_n], axis=1)
        dgh[step, :b] = xp.concatenate([d_r, d_z, d_n * r + dhn[step, :b]], axis=1)
        dh[:b] = dhb * z + dgh[step, :b] @ w_hh
    return dgx, dgh, dh


for _layer_op in (lstm_layer, lstm_layer_grad, gru_layer, gru_layer_grad):
    add_half_kernels(_layer_op)  # their half dtypes widened on every device too, now they have a kernel there
