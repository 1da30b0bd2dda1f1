"""Checks of distributed training against one process in float64, each a function of the rank's communicator (and a
directory every rank sees) that asserts on its rank. tests/test_distributed.py runs each on ranks that are threads
of one process (`of.distributed.run_threads`), and ranks_training.py runs them all on MPI ranks (`mpiexec -n 2` and
`-n 4`): one definition of each check, two kinds of ranks. Batches have 8 rows, so 1, 2, 4 or 8 ranks split them."""

import numpy as np

import opforge as of
from opforge import nn
from opforge import ops as F
from opforge.distributed import S

ROWS = 8


def mine(comm, array):
    """This rank's block of rows of ``array``."""
    return np.split(array, comm.size)[comm.rank]


def whole(comm, value, layout):
    """The whole value from this rank's part of it."""
    return comm.all_gather(value, layout.axis) if layout.split else value


def close(got, want, what, rtol=1e-12):
    np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-14, err_msg=what)


def compiled_step(fn):
    """of.compile of ``fn``'s loss, with ``loss.backward()`` in the step."""
    def step(*args):
        loss = fn(*args)
        loss.backward()
        return loss

    return of.compile(step)


# -- SBP rules see whole shapes --------------------------------------------------------------------------------------


def check_reshape_of_a_split_value(comm, tmp):
    """reshape(x, [4, -1]) of x: S(0) (8, 3) is the whole (4, 6): it was marked S(0) on the rank's block and
    gathered to (8, 3)."""
    x = np.arange(24.0).reshape(ROWS, 3)
    for shape in ([4, -1], [8, -1], [2, 12], [-1, 2], [24]):
        program = of.trace(lambda x, shape=shape: F.reshape(x, shape=shape), x=of.Spec((ROWS, 3), "float64"))
        sharded = of.distributed.shard(program, of.distributed.Mesh(comm), feeds={"x": S(0)})
        out = of.Executor(sharded).run(x=mine(comm, x))["out"]
        got = whole(comm, out, sharded.layouts[sharded.outputs["out"]])
        assert np.array_equal(got, x.reshape(shape)), (comm.size, shape, got)


def check_flatten_and_whole_shapes(comm, tmp):
    """nn.Flatten keeps a split batch split (it inserted an all_gather), and traced code sees whole shapes: x.shape[0]
    is the whole batch; the .grad a compiled step leaves is the one-process gradient."""
    rng = np.random.default_rng(0)
    x, w0 = rng.standard_normal((ROWS, 2, 3)), rng.standard_normal((6, 4))

    def loss_of(x, w):
        h = nn.Flatten()(x) @ w
        return F.sum(h * h) / x.shape[0]

    w = of.tensor(w0, requires_grad=True)
    want = loss_of(of.tensor(x), w)
    want.backward()
    program = of.trace(lambda x: loss_of(x, of.tensor(w0)), x=of.Spec((ROWS, 2, 3), "float64"))
    sharded = of.distributed.shard(program, of.distributed.Mesh(comm), feeds={"x": S(0)})
    assert "all_gather" not in [op.type for op in sharded.block.ops], sharded
    close(of.Executor(sharded).run(x=mine(comm, x))["out"], want.numpy(), "shard()")
    w_here = of.tensor(w0, requires_grad=True)
    with of.distributed.Mesh(comm):
        loss = compiled_step(lambda x: loss_of(x, w_here))(of.tensor(mine(comm, x)))
    close(loss.numpy(), want.numpy(), "compiled loss")
    close(w_here.grad.numpy(), w.grad.numpy(), "compiled .grad")


# -- cross_entropy over split rows ---------------------------------------------------------------------------------


def check_cross_entropy_with_ignored_rows(comm, tmp):
    """The mean over every rank's rows that count: the first rows hold no ignore_index target, the last mostly (the
    mean of the ranks' means was off)."""
    rng = np.random.default_rng(1)
    logits0, target = rng.standard_normal((ROWS, 3)), np.array([0, 1, 2, 1, 2, -100, -100, 0])
    for weight in (None, rng.uniform(0.5, 2.0, 3)):
        def loss_of(logits, target, weight=weight):
            return F.cross_entropy(logits, target, None if weight is None else of.tensor(weight))

        logits = of.tensor(logits0, requires_grad=True)
        want = loss_of(logits, of.tensor(target))
        want.backward()
        program = of.trace(loss_of, logits=of.Spec((ROWS, 3), "float64"), target=of.Spec((ROWS,), "int64"))
        mesh = of.distributed.Mesh(comm)
        sharded = of.distributed.shard(program, mesh, feeds={"logits": S(0), "target": S(0)})
        close(of.Executor(sharded).run(logits=mine(comm, logits0), target=mine(comm, target))["out"], want.numpy(),
              "shard()")
        here = of.tensor(mine(comm, logits0), requires_grad=True)
        with mesh:
            loss = compiled_step(loss_of)(here, of.tensor(mine(comm, target)))
        close(loss.numpy(), want.numpy(), "compiled")
        close(comm.all_gather(here.grad.numpy(), 0), logits.grad.numpy(), "the gradient of the rank's rows")


# -- what a compiled step returns ----------------------------------------------------------------------------------


def check_compiled_step_returns_the_whole_loss(comm, tmp):
    rng = np.random.default_rng(2)
    x, t, w0 = rng.standard_normal((ROWS, 3)), rng.standard_normal((ROWS, 2)), rng.standard_normal((3, 2))
    want = F.mse_loss(of.tensor(x) @ of.tensor(w0), of.tensor(t)).numpy()  # a mean over rows: P(mean) when split
    w = of.tensor(w0, requires_grad=True)
    with of.distributed.Mesh(comm):
        out = of.compile(lambda x, t: {"loss": F.mse_loss(x @ w, t), "rows": x @ w})(of.tensor(mine(comm, x)),
                                                                                   of.tensor(mine(comm, t)))
    close(out["loss"].numpy(), want, "the loss: the whole batch's, not the rank's part")
    close(out["rows"].numpy(), mine(comm, x @ w0), "a split result: the rank's block")


# -- data parallel, compiled ---------------------------------------------------------------------------------------


def tiny_model():
    of.manual_seed(0)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()


def train_steps(model, opt, batches, compiled=True, mesh=None):
    def step(x, y):
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    fn = of.compile(step) if compiled else step
    if mesh is None:
        return fn, [fn(of.tensor(x), of.tensor(y)).numpy() for x, y in batches]
    with mesh:
        return fn, [fn(of.tensor(x), of.tensor(y)).numpy() for x, y in batches]


def check_data_parallel_compiled_outside_a_mesh(comm, tmp):
    """of.compile of a DistributedDataParallel model's step outside any mesh, as PyTorch users write it, averages
    over the ranks (each rank trained on its own half)."""
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((ROWS, 5)), rng.integers(0, 3, ROWS)) for _ in range(3)]
    one = tiny_model()
    _, want = train_steps(one, of.optim.SGD(one.parameters(), lr=0.1, momentum=0.9), batches, compiled=False)
    ddp = of.distributed.DistributedDataParallel(tiny_model(), comm=comm)
    step, losses = train_steps(ddp, of.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9),
                               [(mine(comm, x), mine(comm, y)) for x, y in batches])
    assert comm.size == 1 or "all_reduce" in str(next(iter(step.cache.values()))[0].program)
    close(losses, want, "every rank's loss: the whole batch's")
    for got, p in zip(ddp.parameters(), one.parameters()):
        close(got.numpy(), p.numpy(), "trained parameters", rtol=1e-11)
    try:
        of.trace(of.distributed.DistributedDataParallel(tiny_model(), comm=comm), x=of.Spec((4, 5), "float64"))
        assert comm.size == 1, "of.trace of a DistributedDataParallel model outside a mesh must fail"
    except of.OpforgeError as e:
        assert "traced outside a distribution mesh" in str(e), e


def check_compiled_outside_a_mesh_is_traced_again_inside(comm, tmp):
    """A step first compiled outside a mesh does not keep its one-process program inside one: the mesh is part of
    the cache key (and a new Mesh of the same communicator and layouts finds the same program)."""
    x, y = np.random.default_rng(4).standard_normal((4, 5)), np.arange(4) % 3
    model = tiny_model()
    step, _ = train_steps(model, of.optim.SGD(model.parameters(), lr=0.1), [(x, y)])  # one process's program
    for _ in range(2):
        with of.distributed.Mesh(comm):
            step(of.tensor(x + comm.rank), of.tensor(y))  # the ranks' batches differ
    assert len(step.cache) == 2
    for p in model.parameters():  # the ranks' gradients were averaged: the replicas stay equal
        assert all(np.array_equal(a, p.numpy()) for a in comm.all_gather(p.numpy()[None], 0))


# -- tensor parallel under a mesh: whole tensors -------------------------------------------------------------------


def mlp_params(seed=5):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in [(8, 5), (8,), (3, 8), (3,)]]


OPTIMIZERS = {"sgd-momentum": lambda ps: of.optim.SGD(ps, lr=0.05, momentum=0.9),
              "adam": lambda ps: of.optim.Adam(ps, lr=0.01)}


def train_mlp(params, batches, optimizer, mesh=None):
    """Train the MLP (whole tensors ``params``) on ``batches``, compiled (under ``mesh`` if given): the losses."""
    w1, b1, w2, b2 = params
    opt = OPTIMIZERS[optimizer](params)

    def step(x, t):
        loss = F.mse_loss(F.linear(F.relu(F.linear(x, w1, b1)), w2, b2), t)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    compiled = of.compile(step)
    if mesh is None:
        return [compiled(of.tensor(x), of.tensor(t)).numpy() for x, t in batches]
    with mesh:
        return [compiled(of.tensor(x), of.tensor(t)).numpy() for x, t in batches]


def check_tensor_parallel_takes_whole_tensors_and_saves_them(comm, tmp):
    """Mesh(params={w: S(0)}) takes the whole w, as shard() does (given whole weights it trained another model); any
    optimizer works; every rank holds the whole trained tensors, and save/load round-trip them (rank 0 wrote its
    block)."""
    rng = np.random.default_rng(6)
    batches = [(rng.standard_normal((ROWS, 5)), rng.standard_normal((ROWS, 3))) for _ in range(3)]
    for optimizer in sorted(OPTIMIZERS):
        one = [of.tensor(a, requires_grad=True) for a in mlp_params()]
        want = train_mlp(one, batches[:2], optimizer)
        want += train_mlp(one, batches[2:], optimizer)  # then from the same values, with a new optimizer

        def tensor_parallel(params, batches, optimizer=optimizer):
            mesh = of.distributed.Mesh(comm, params={params[0]: S(0), params[1]: S(0), params[2]: S(1)})
            return train_mlp(params, [(mine(comm, x), mine(comm, t)) for x, t in batches], optimizer, mesh)

        params = [of.tensor(a, requires_grad=True) for a in mlp_params()]  # whole, as one process has them
        losses = tensor_parallel(params, batches[:2])
        path = f"{tmp}/tensor_parallel.npz"
        of.distributed.save({f"p{i}": p for i, p in enumerate(params)}, path, comm=comm)
        loaded = [of.tensor(of.distributed.load(path)[f"p{i}"].numpy(), requires_grad=True) for i in range(4)]
        losses += tensor_parallel(loaded, batches[2:])  # as another job would go on from the checkpoint
        close(losses, want, optimizer)
        for got, p in zip(loaded, one):  # the whole trained tensors, on every rank
            close(got.numpy(), p.numpy(), optimizer, rtol=1e-11)
        comm.barrier()  # (the next save writes the same file)


def check_shard_of_a_traced_training_step(comm, tmp):
    """shard() of a traced step (forward, loss.backward(), opt.step()) with split parameters: the optimizer state
    follows its parameter's layout (each rank keeps and updates its block of the moments), the trained values equal
    one process's, and whole_values() gathers them for a checkpoint that loads whole."""
    rng = np.random.default_rng(9)
    batches = [(rng.standard_normal((ROWS, 5)), rng.standard_normal((ROWS, 3))) for _ in range(2)]
    for optimizer in sorted(OPTIMIZERS):
        one = [of.tensor(a, requires_grad=True) for a in mlp_params()]
        want = train_mlp(one, batches, optimizer)
        params = [of.tensor(a, requires_grad=True) for a in mlp_params()]
        opt = OPTIMIZERS[optimizer](params)

        def step(x, t, w1=params[0], b1=params[1], w2=params[2], b2=params[3], opt=opt):
            loss = F.mse_loss(F.linear(F.relu(F.linear(x, w1, b1)), w2, b2), t)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        program = of.trace(step, x=of.Spec((ROWS, 5), "float64"), t=of.Spec((ROWS, 3), "float64"))
        sharded = of.distributed.shard(program, of.distributed.Mesh(comm), feeds={"x": S(0), "t": S(0)},
                                       params={params[0]: S(0), params[1]: S(0), params[2]: S(1)})
        state = [n for n in sharded.values if n.startswith("param.1.") and not n.endswith(".step")]
        assert state and all(sharded.layouts[n] == S(0) for n in state), sharded.layouts
        assert all(sharded.block.vars[n].spec.shape == (8 // comm.size, 5) for n in state)  # blocks, not whole
        exe = of.Executor(sharded)
        losses = [exe.run(x=mine(comm, x), t=mine(comm, t))["out"] for x, t in batches]
        close(losses, want, optimizer)
        values = of.distributed.whole_values(sharded, comm)
        for got, p in zip(["param.1", "param.2", "param.5", "param.6"], one):
            close(values[got], p.numpy(), f"{optimizer}: {got}", rtol=1e-11)
        path = f"{tmp}/sharded.npz"
        of.distributed.save(values, path, comm=comm)
        loaded = of.distributed.load(path)
        assert all(np.array_equal(loaded[k], v) for k, v in values.items())
        comm.barrier()


def check_sharded_checkpoint_of_a_sharded_training_step(comm, tmp):
    """save_sharded() of a shard()ed Adam step: each rank writes its blocks of the parameters and moments; the
    checkpoint loads whole on one rank, and into a new sharded program that goes on training as one process does."""
    rng = np.random.default_rng(14)
    batches = [(rng.standard_normal((ROWS, 5)), rng.standard_normal((ROWS, 3))) for _ in range(2)]
    one = [of.tensor(a, requires_grad=True) for a in mlp_params()]
    want = train_mlp(one, batches, "adam")

    def sharded_step():
        params = [of.tensor(a, requires_grad=True) for a in mlp_params()]
        opt = OPTIMIZERS["adam"](params)

        def step(x, t, w1=params[0], b1=params[1], w2=params[2], b2=params[3]):
            loss = F.mse_loss(F.linear(F.relu(F.linear(x, w1, b1)), w2, b2), t)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        program = of.trace(step, x=of.Spec((ROWS, 5), "float64"), t=of.Spec((ROWS, 3), "float64"))
        return of.distributed.shard(program, of.distributed.Mesh(comm), feeds={"x": S(0), "t": S(0)},
                                    params={params[0]: S(0), params[1]: S(0), params[2]: S(1)})

    first = sharded_step()
    x, t = batches[0]
    losses = [of.Executor(first).run(x=mine(comm, x), t=mine(comm, t))["out"]]
    path = f"{tmp}/sharded-step"
    of.distributed.save_sharded(first, path, comm=comm)
    whole = of.distributed.load_sharded(path, comm=of.distributed.SELF)  # one rank: every value whole
    for name, value in of.distributed.whole_values(first, comm).items():
        assert np.array_equal(whole[name], value), name
    second = sharded_step()  # another job: fresh values, then the checkpoint's
    of.distributed.load_sharded(path, comm=comm, into=second)
    x, t = batches[1]
    losses.append(of.Executor(second).run(x=mine(comm, x), t=mine(comm, t))["out"])
    close(losses, want, "losses")
    for got, p in zip(["param.1", "param.2", "param.5", "param.6"], one):
        close(of.distributed.whole_values(second, comm)[got], p.numpy(), got, rtol=1e-11)
    comm.barrier()


def persistent_bytes(program) -> int:
    """Bytes of the values a program keeps between steps (parameters, optimizer state) on this rank."""
    return sum(np.asarray(v).nbytes for k, v in program.values.items() if program.block.vars[k].persistable)


def check_zero_stages_and_fully_sharded_parameters(comm, tmp):
    """shard(zero=1, 2, 3) of a data-parallel training step: each rank keeps its block of the optimizer state (1),
    gets only its block of the gradients, reduce-scattered (2), and holds only its block of the parameters, gathered
    where used (3: FSDP). SGD with momentum and Adam train as one process; the memory each rank keeps shrinks."""
    rng = np.random.default_rng(15)
    start = [rng.standard_normal(shape) * 0.5 for shape in [(16, 8), (16,), (4, 16), (4,)]]
    batches = [(rng.standard_normal((ROWS, 8)), rng.standard_normal((ROWS, 4))) for _ in range(2)]
    for optimizer in sorted(OPTIMIZERS):
        one = [of.tensor(a, requires_grad=True) for a in start]
        want = train_mlp(one, batches, optimizer)
        kept = {}
        for zero in (0, 1, 2, 3):
            params = [of.tensor(a, requires_grad=True) for a in start]
            opt = OPTIMIZERS[optimizer](params)

            def step(x, t, w1=params[0], b1=params[1], w2=params[2], b2=params[3], opt=opt):
                loss = F.mse_loss(F.linear(F.relu(F.linear(x, w1, b1)), w2, b2), t)
                loss.backward()
                opt.step()
                opt.zero_grad()
                return loss

            program = of.trace(step, x=of.Spec((ROWS, 8), "float64"), t=of.Spec((ROWS, 4), "float64"))
            sharded = of.distributed.shard(program, of.distributed.Mesh(comm), feeds={"x": S(0), "t": S(0)},
                                           zero=zero)
            exe = of.Executor(sharded)
            losses = [exe.run(x=mine(comm, x), t=mine(comm, t))["out"] for x, t in batches]
            close(losses, want, f"zero={zero} {optimizer}: losses")
            values = of.distributed.whole_values(sharded, comm)
            for name, p in zip(["param.1", "param.2", "param.5", "param.6"], one):
                close(values[name], p.numpy(), f"zero={zero} {optimizer}: {name}", rtol=1e-11)
            kept[zero] = persistent_bytes(sharded)
            types = [op.type for op in sharded.block.ops]
            if comm.size > 1:
                state = [k for k in sharded.values if k.startswith("param.1.") and not k.endswith(".step")]
                assert all(sharded.layouts[k] == (S(0) if zero else of.distributed.B) for k in state), zero
                assert ("reduce_scatter" in types) == (zero >= 2), (zero, types)  # the gradients' blocks
                assert (sharded.layouts["param.1"] == S(0)) == (zero == 3), zero  # FSDP's parameter blocks
        if comm.size > 1:
            assert kept[0] > kept[1] == kept[2] > kept[3], kept


def check_two_dimensional_mesh_data_by_tensor(comm, tmp):
    """A 2-D mesh (data × tensor: 2×2 on 4 ranks, 1×2 on 2) with a communicator per axis and a layout per axis:
    the batch (S(0), B), a column-parallel then a row-parallel layer (B, S(0)) and (B, S(1)). SGD with momentum and
    Adam train as one process; each rank holds its tensor-axis block of the weights and of their state."""
    shape = (comm.size // 2, 2) if comm.size % 2 == 0 else (comm.size, 1)
    mesh = of.distributed.Mesh(comm, shape=shape)
    data, tensor = mesh.axes
    assert (data.size, tensor.size) == shape and data.rank * shape[1] + tensor.rank == comm.rank
    rng = np.random.default_rng(16)
    start = [rng.standard_normal(shape) * 0.5 for shape in [(8, 6), (8,), (4, 8), (4,)]]
    batches = [(rng.standard_normal((ROWS, 6)), rng.standard_normal((ROWS, 4))) for _ in range(2)]
    for optimizer in sorted(OPTIMIZERS):
        one = [of.tensor(a, requires_grad=True) for a in start]
        want = train_mlp(one, batches, optimizer)
        params = [of.tensor(a, requires_grad=True) for a in start]
        opt = OPTIMIZERS[optimizer](params)

        def step(x, t, w1=params[0], b1=params[1], w2=params[2], b2=params[3], opt=opt):
            loss = F.mse_loss(F.linear(F.relu(F.linear(x, w1, b1)), w2, b2), t)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        program = of.trace(step, x=of.Spec((ROWS, 6), "float64"), t=of.Spec((ROWS, 4), "float64"))
        batch, weight = (S(0), "B"), ("B", S(0))
        sharded = of.distributed.shard(program, mesh, feeds={"x": batch, "t": batch},
                                       params={params[0]: weight, params[1]: weight, params[2]: ("B", S(1))})
        assert sharded.nd_layouts["param.1"] == (of.distributed.B, S(0)) and sharded.nd_layouts["x"][0] == S(0)
        assert sharded.block.vars["param.1"].spec.shape == (8 // shape[1], 6)  # the tensor axis's block
        state = [k for k in sharded.values if k.startswith("param.1.") and not k.endswith(".step")]
        assert all(sharded.block.vars[k].spec.shape == (8 // shape[1], 6) for k in state), state
        exe = of.Executor(sharded)
        with mesh:  # the collectives of each axis run over its group
            losses = [exe.run(x=np.split(x, shape[0])[data.rank], t=np.split(t, shape[0])[data.rank])["out"]
                      for x, t in batches]
        close(losses, want, f"{optimizer}: losses")
        values = of.distributed.whole_values(sharded)
        for name, p in zip(["param.1", "param.2", "param.5", "param.6"], one):
            close(values[name], p.numpy(), f"{optimizer}: {name}", rtol=1e-11)
        # a sharded checkpoint of the 2-D layouts: whole on one process, in blocks on the ranks as one axis
        path = f"{tmp}/two-dimensional-{optimizer}"
        of.distributed.save_sharded(sharded, path)
        whole = of.distributed.load_sharded(path, layouts={k: "B" for k in values}, comm=of.distributed.SELF)
        assert all(np.array_equal(whole[k], v) for k, v in values.items())
        rows = of.distributed.load_sharded(path, layouts={"param.1": S(0)}, comm=comm)["param.1"]
        assert np.array_equal(rows, mine(comm, values["param.1"]))
        try:  # a value split over 2 axes is not guessed onto one
            of.distributed.load_sharded(path, comm=of.distributed.SELF)
            raise AssertionError("loading 2-D layouts on one axis without layouts must fail")
        except of.distributed.ShardedCheckpointError as e:
            assert "'param.1' was saved over an n-D mesh, (B, S(0))" in str(e), e
        comm.barrier()


def check_a_mesh_refuses_parameters_that_differ_between_ranks(comm, tmp):
    blocks = np.random.default_rng(8).standard_normal((4 * comm.size, 5))
    w = of.tensor(mine(comm, blocks), requires_grad=True)  # each rank its block of a whole (16, 5): another model
    try:
        with of.distributed.Mesh(comm, params={w: S(0)}):
            of.compile(lambda x: F.linear(x, w))(of.tensor(np.ones((4, 5))))
        assert comm.size == 1, "a rank's block given as the whole tensor must be refused"
    except of.ArgumentError as e:
        assert "'param.1' (read as S(0)) differ between the ranks" in str(e) and "not a rank's block" in str(e), e


# -- data parallel, eager: parameters the forward does not use -----------------------------------------------------


class WithUnused(nn.Module):
    """A layer the forward never uses, and one only rank 0 uses."""

    def __init__(self, rank, rank0_layer=True):
        super().__init__()
        of.manual_seed(0)
        self.rank, self.rank0_layer = rank, rank0_layer
        self.used, self.unused, self.rank0 = (nn.Linear(5, 3).double(), nn.Linear(5, 3).double(),
                                              nn.Linear(3, 3).double())

    def forward(self, x):
        h = self.used(x)
        return self.rank0(h) if self.rank0_layer and self.rank == 0 else h


def check_data_parallel_with_unused_parameters(comm, tmp):
    """As PyTorch: an error at the end of the first backward naming them (their buckets were never averaged and the
    next step raised a raw AttributeError); with find_unused_parameters=True the mean over the ranks, zeros where a
    rank did not use it, and no gradient where no rank did."""
    x, y = np.random.default_rng(7).standard_normal((ROWS, 5)), np.arange(ROWS) % 3
    model = of.distributed.DistributedDataParallel(WithUnused(comm.rank, rank0_layer=False), comm=comm,
                                                   bucket_bytes=100)
    try:  # every rank leaves the same layer out (a rank that used it would wait for the others' buckets)
        F.cross_entropy(model(of.tensor(x)), of.tensor(y)).backward()
        raise AssertionError("a parameter the forward never used must be an error")
    except of.OpforgeError as e:
        assert ("4 parameter(s) got no gradient in this backward pass: 'rank0.bias', 'rank0.weight', 'unused.bias', "
                "'unused.weight'") in str(e), e
        assert "find_unused_parameters=True" in str(e), e

    model = of.distributed.DistributedDataParallel(WithUnused(comm.rank), comm=comm, bucket_bytes=100,
                                                   find_unused_parameters=True)
    opt = of.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(2):
        F.cross_entropy(model(of.tensor(x)), of.tensor(y)).backward()
        got = {n: p.grad for n, p in model.module.named_parameters()}
        if step == 0:
            own = []
            for rank in range(comm.size):  # each rank's own gradients, computed here
                alone = WithUnused(rank)
                F.cross_entropy(alone(of.tensor(x)), of.tensor(y)).backward()
                own.append({n: p.grad for n, p in alone.named_parameters()})
            for name in ["used.weight", "used.bias", "rank0.weight", "rank0.bias"]:  # zeros where unused
                want = np.mean([np.zeros(got[name].shape) if g[name] is None else g[name].numpy() for g in own],
                               axis=0)
                close(got[name].numpy(), want, name, rtol=1e-13)
        assert got["unused.weight"] is None and got["unused.bias"] is None, step  # no rank used it: as one process
        opt.step()
        opt.zero_grad()


# -- data parallel through the SBP pass: each rank computes its own rows, never the gathered batch ---------------------


class Gate(nn.Module):
    """x·softmax(x) over the features: a softmax in an MLP."""

    def forward(self, x):
        return x * F.softmax(x, axis=-1)


class TokenModel(nn.Module):
    """An embedding, a Transformer encoder layer (attention, layer norms) with a causal mask, and a head."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(11, 8)
        self.layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=True)
        self.head = nn.Linear(8, 11)

    def forward(self, x):
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], dtype="float64")
        return F.reshape(self.head(self.layer(self.emb(x), src_mask=mask, is_causal=True)), shape=[-1, 11])


def layer_models():
    """{name: (model, x, y)}: an MLP with a layer norm and a softmax, a CNN with batch and group norms, and a
    Transformer block, each in float64 with a batch of ROWS."""
    rng = np.random.default_rng(10)
    of.manual_seed(1)
    mlp = nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.ReLU(), Gate(), nn.Linear(8, 3)).double()
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.GroupNorm(2, 4),
                        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16, 3)).double()
    tokens = TokenModel().double()
    return {"mlp": (mlp, rng.standard_normal((ROWS, 6)), rng.integers(0, 3, ROWS)),
            "cnn": (cnn, rng.standard_normal((ROWS, 3, 4, 4)), rng.integers(0, 3, ROWS)),
            "transformer": (tokens, rng.integers(0, 11, (ROWS, 5)), rng.integers(0, 11, ROWS * 5))}


def state(model):
    return {k: v.numpy().copy() for k, v in model.state_dict().items()}


def activations_gathered(program) -> list:
    """The all_gather / all_to_all ops of ``program`` that move rows of a batch (values of 2 dims or more, more than
    one row): not those of a per-channel statistic, (C,) or (1, C, 1, 1)."""
    def rows(name):
        shape = program.block.vars[name].spec.shape
        return len(shape) > 1 and shape[0] != 1

    return [op for op in program.block.ops if op.type in ("all_gather", "all_to_all") and rows(op.inputs["x"][0])]


def check_data_parallel_layers_compute_each_rank_rows(comm, tmp):
    """Softmax, layer/batch/group norm, pooling, embedding and attention have SBP rules: data parallelism through
    the pass computes each rank's rows and gathers no activation (the norms, the embedding and attention gathered
    the batch), and two compiled SGD steps equal one process's, parameters and batch-norm running statistics
    (synchronised batch norm: the statistics of the whole batch)."""
    for name, (model, x, y) in layer_models().items():
        want = layer_models()[name][0]  # the same model, for one process
        opt = of.optim.SGD(want.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            loss = F.cross_entropy(want(of.tensor(x)), of.tensor(y))
            loss.backward()
            opt.step()
            opt.zero_grad()
        opt = of.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        step, losses = train_steps(model, opt, [(mine(comm, x), mine(comm, y))] * 2, mesh=of.distributed.Mesh(comm))
        program = next(iter(step.cache.values()))[0].program
        assert not activations_gathered(program), (name, activations_gathered(program))
        assert program.block.vars[program.feeds[0]].spec.shape[0] == ROWS // comm.size, name
        close(losses[-1], loss.numpy(), f"{name}: the loss")
        for key, value in state(want).items():
            close(state(model)[key], value, f"{name}: {key}", rtol=1e-10)


def bn_model():
    of.manual_seed(2)
    return nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.BatchNorm2d(3), nn.ReLU(), nn.Flatten(),
                         nn.Linear(48, 3)).double()


def check_batch_norm_local_statistics_as_data_parallel(comm, tmp):
    """DistributedDataParallel normalises with each rank's batch statistics, eagerly (as PyTorch's) and compiled
    (it was compiled with the whole batch's: another model than eager DDP trained); the running statistics are the
    mean of the ranks', the same on every rank. Mesh(batch_norm="local") asks for it, the default is synchronised."""
    rng = np.random.default_rng(11)
    batches = [(rng.standard_normal((ROWS, 2, 4, 4)), rng.integers(0, 3, ROWS)) for _ in range(2)]
    batches = [(mine(comm, x), mine(comm, y)) for x, y in batches]
    trained = []
    for compiled in (False, True):
        model = of.distributed.DistributedDataParallel(bn_model(), comm=comm)
        train_steps(model, of.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), batches, compiled)
        trained.append(state(model.module))
    for key, value in trained[0].items():
        close(trained[1][key], value, f"compiled against eager: {key}", rtol=1e-11)
        assert (comm.all_gather(value[None], 0) == value).all(), f"{key} differs between the ranks"
    # one step with local statistics, against each rank's own batch in one process
    x = batches[0][0]
    alone, model = bn_model(), bn_model()
    with of.distributed.Mesh(comm, batch_norm="local"):
        out = of.compile(lambda x: model(x))(of.tensor(x))
    close(out.numpy(), alone(of.tensor(x)).numpy(), "the output of the rank's rows")
    close(model[1].running_mean.numpy(), np.mean(comm.all_gather(alone[1].running_mean.numpy()[None], 0), axis=0),
          "running mean: the ranks' mean")


def check_vocabulary_parallel_embedding_and_attention_heads_split(comm, tmp):
    """Tensor parallelism through the pass: the embedding table split by rows (vocabulary-parallel: each rank looks
    up the rows it holds, a partial sum), q/k/v projections split by columns so that attention runs on each rank's
    heads, the output projection by rows. Adam, compiled under a mesh, against one process."""
    rng = np.random.default_rng(12)
    n, length, vocab, dim, heads = 2, 3, 8, 16, 4  # weights larger than activations: tensor parallel pays
    batches = [(rng.integers(0, vocab, (n, length)), rng.integers(0, dim, n * length)) for _ in range(2)]
    start = [rng.standard_normal((vocab, dim))] + [rng.standard_normal((dim, dim)) * 0.5 for _ in range(4)]

    def train(mesh=None):
        emb, wq, wk, wv, wo = params = [of.tensor(a, requires_grad=True) for a in start]
        opt = of.optim.Adam(params, lr=0.01)

        def heads_of(t):  # (n, length, dim) -> (n, heads, length, dim / heads)
            return F.permute(F.reshape(t, shape=[n, length, heads, dim // heads]), dims=[0, 2, 1, 3])

        def step(x, t):
            h = F.embedding(x, emb)
            a = F.scaled_dot_product_attention(heads_of(F.linear(h, wq)), heads_of(F.linear(h, wk)),
                                               heads_of(F.linear(h, wv)), is_causal=True)
            out = F.linear(F.reshape(F.permute(a, dims=[0, 2, 1, 3]), shape=[n * length, dim]), wo)
            loss = F.cross_entropy(out, t)
            loss.backward()
            opt.step()
            opt.zero_grad()
            return loss

        compiled = of.compile(step)
        if mesh is None:
            return [compiled(of.tensor(x), of.tensor(t)).numpy() for x, t in batches], params, compiled
        with mesh(params):
            return [compiled(of.tensor(x), of.tensor(t)).numpy() for x, t in batches], params, compiled

    want, one, _ = train()
    got, params, compiled = train(lambda p: of.distributed.Mesh(
        comm, feeds={"x": "B", "t": "B"}, params={p[0]: S(0), p[1]: S(0), p[2]: S(0), p[3]: S(0), p[4]: S(1)}))
    close(got, want, "losses")
    for g, w in zip(params, one):
        close(g.numpy(), w.numpy(), "trained parameters", rtol=1e-10)
    program = next(iter(compiled.cache.values()))[0].program
    ops = {op.type: op for op in program.block.ops if op.role == "forward"}
    spec = program.block.vars[ops["dot_product_attention"].inputs["q"][0]].spec
    assert spec.shape == (n, heads // comm.size, length, dim // heads), spec  # this rank's heads
    lookup = ops["embedding_rows"]  # the vocabulary-parallel lookup
    assert program.block.vars[lookup.inputs["weight"][0]].spec.shape == (vocab // comm.size, dim)  # its rows


CHECKS = [name for name in list(globals()) if name.startswith("check_")]
