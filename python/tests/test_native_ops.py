"""Native tern kernels against the CPU: values, dtypes, shapes, and no fallback.

Each case runs a function on CPU tensors and on tern copies of them, compares
the results (and gradients, for the `grad` cases) and checks that no
operator took the CPU fallback on tern.
"""

import json

import pytest
import torch
import torch.nn.functional as F

import torch_tern


def to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (list, tuple)):
        return type(x)(to(v, device) for v in x)
    return x


def close(actual, expected, tol):
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor)
        assert actual.device.type == "cpu"
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, (actual, expected)
        torch.testing.assert_close(actual, expected, rtol=tol, atol=tol, equal_nan=True)
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            close(a, e, tol)
    else:
        assert actual == expected


def grads(fn):
    """fn(*floats) -> gradients of sum(fn * weights) with respect to the float inputs."""

    def run(*xs):
        xs = [x.detach().clone().requires_grad_() if x.is_floating_point() else x for x in xs]
        y = fn(*xs)
        weights = torch.linspace(-1, 1, y.numel()).reshape(y.shape).to(y.device)
        (y * weights).sum().backward()
        return [x.grad for x in xs if x.is_floating_point()]

    return run


g = torch.Generator().manual_seed(0)


def r(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(dtype)


def pos(*shape):
    return torch.rand(*shape, generator=g) + 0.1


def idx(high, *shape):
    return torch.randint(0, high, shape, generator=g)


A, B, C = r(4, 5), r(5), r(4, 1)
M1, M2 = r(3, 4), r(4, 6)
X4, W4, B4 = r(2, 3, 8, 8), r(4, 3, 3, 3), r(4)
LOGP, TARGET = r(6, 5).log_softmax(1), torch.tensor([0, 4, -100, 2, 2, 1])

CASES = [
    # elementwise, broadcasting, scalars, dtypes, layouts
    ("add broadcast", lambda x, y: x + y, (A, B), 1e-6),
    ("add alpha", lambda x, y: torch.add(x, y, alpha=2.5), (A, C), 1e-6),
    ("sub scalar", lambda x: x - 3, (A,), 1e-6),
    ("mul int", lambda x, y: x * y, (idx(9, 6), idx(9, 6)), 0),
    ("int plus float", lambda x, y: x + y, (idx(9, 5), B), 1e-6),
    ("div int promotes", lambda x, y: x / y, (idx(9, 6), idx(9, 6) + 1), 1e-6),
    ("div floor", lambda x, y: torch.div(x, y, rounding_mode="floor"), (A, B), 1e-6),
    ("div trunc", lambda x, y: torch.div(x, y, rounding_mode="trunc"), (A, B), 1e-6),
    ("bf16 times scalar", lambda x: x * 0.1, (A.bfloat16(),), 0),
    ("in place", lambda x, y: x.mul_(y).add_(1), (A.clone(), B), 1e-6),
    ("out=", lambda x, y, o: torch.mul(x, y, out=o), (A, B, torch.empty(4, 5)), 1e-6),
    ("transposed input", lambda x: x.t() * 2 + x.t(), (A,), 1e-6),
    ("strided slice", lambda x: x[:, ::2].exp(), (A,), 1e-6),
    ("comparisons", lambda x, y: (x < y, x >= 0, x == x, x != y), (A, B), 0),
    ("where", torch.where, (A > 0, A, B), 0),
    ("where scalar", lambda c, x: torch.where(c, x, 0.5), (A > 0, A), 0),
    ("masked_fill", lambda x, m: x.masked_fill(m, -1e9), (A, A > 0), 0),
    ("clamp", lambda x: x.clamp(-0.5, 0.5), (A,), 0),
    ("clamp tensors", lambda x, lo, hi: x.clamp(lo, hi), (A, B, B + 1), 0),
    ("lerp", lambda x, y: (torch.lerp(x, y, 0.3), torch.lerp(x, y, 0.8)), (A, A.flip(0)), 1e-6),
    ("addcmul addcdiv", lambda x, y, z: (torch.addcmul(x, y, z, value=0.3),
                                         torch.addcdiv(x, y, z, value=-0.5)), (A, B, pos(4, 1)),
     1e-6),
    ("pow special exponents", lambda x: [x ** e for e in (0, 1, 2, 3, -1, -2, 0.5, -0.5, 1.7)],
     (pos(3, 4),), 1e-5),
    ("pow tensor", torch.pow, (pos(4, 5), B), 1e-5),
    ("unary", lambda x: [f(x) for f in (torch.neg, torch.abs, torch.exp, torch.tanh, torch.sigmoid,
                                        torch.sin, torch.cos, torch.floor, torch.round,
                                        torch.sign, torch.erf)], (A,), 1e-5),
    ("unary positive", lambda x: [f(x) for f in (torch.log, torch.sqrt, torch.rsqrt,
                                                 torch.reciprocal, torch.log1p)], (pos(4, 5),),
     1e-5),
    ("activations", lambda x: [F.relu(x), F.gelu(x), F.gelu(x, approximate="tanh"), F.silu(x),
                               F.leaky_relu(x, 0.2), F.elu(x), F.softplus(x), F.hardswish(x),
                               F.hardsigmoid(x), F.mish(x)], (A,), 1e-5),
    ("activation grads", grads(lambda x: F.relu(x) + F.gelu(x) + F.silu(x) + torch.tanh(x) +
                               torch.sigmoid(x)), (A,), 1e-5),
    ("integer trunc division", lambda a, b: (torch.div(a, b, rounding_mode="trunc"),
                                             torch.div(a, 3, rounding_mode="trunc"),
                                             torch.div(a, -4, rounding_mode="trunc")),
     (torch.arange(-12, 12), torch.tensor([5, -5, 3, -3] * 6)), 0),
    ("logsigmoid", lambda x: F.logsigmoid(x * 30), (A,), 1e-5),
    ("logsigmoid grad", grads(lambda x: F.logsigmoid(x * 30)), (A,), 1e-5),
    ("mse_loss", lambda x, y: (F.mse_loss(x, y), F.mse_loss(x, y, reduction="sum")), (A, A * 0.5),
     1e-5),
    ("mse_loss grad", grads(lambda x, y: F.mse_loss(x, y)), (A, r(4, 5)), 1e-6),
    # reductions
    ("sum", lambda x: (x.sum(), x.sum(1), x.sum(0, keepdim=True), x.sum((0, 1))), (A,), 1e-5),
    ("sum int and bool", lambda x, y: (x.sum(), (y > 0).sum(1)), (idx(9, 10).int(), A), 0),
    ("mean bf16", lambda x: x.mean(1), (A.bfloat16(),), 1e-2),
    ("max min", lambda x: (x.max(), x.amax(1), x.max(1), x.min(0, keepdim=True)), (A,), 0),
    ("argmax", lambda x: (x.argmax(), x.argmax(1), x.argmin(0)), (A,), 0),
    ("any all prod", lambda x: ((x > 1).any(), (x > -1).all(1), x.prod(1)), (A,), 1e-5),
    ("var std", lambda x: (x.var(1), x.std(), x.var(0, correction=0)), (A,), 1e-5),
    ("softmax", lambda x: (x.softmax(1), x.log_softmax(0)), (A,), 1e-6),
    ("softmax grads", grads(lambda x: x.softmax(1) + x.log_softmax(1)), (A,), 1e-6),
    # normalization
    ("layer_norm", lambda x, w, b: F.layer_norm(x, (5,), w, b), (A, r(5), r(5)), 1e-5),
    ("layer_norm grads", grads(lambda x, w, b: F.layer_norm(x, (5,), w, b)), (A, r(5), r(5)), 1e-5),
    ("rms_norm", lambda x, w: F.rms_norm(x, (5,), w, 1e-6), (A, r(5)), 1e-5),
    ("rms_norm grads", grads(lambda x, w: F.rms_norm(x, (5,), w, 1e-6)), (A, r(5)), 1e-5),
    ("batch_norm train", lambda x, w, b, rm, rv: (F.batch_norm(x, rm, rv, w, b, True, 0.1), rm, rv),
     (X4, r(3), r(3), r(3), pos(3)), 1e-5),
    ("batch_norm eval", lambda x, w, b, rm, rv: F.batch_norm(x, rm, rv, w, b, False),
     (X4, r(3), r(3), r(3), pos(3)), 1e-5),
    ("batch_norm grads", grads(lambda x, w, b: F.batch_norm(x, None, None, w, b, True)),
     (X4, r(3), r(3)), 1e-4),
    ("vector norms", lambda x: (torch.linalg.vector_norm(x), x.norm(dim=1), x.norm(p=1),
                                torch.linalg.vector_norm(x, float("inf"), dim=0)), (A,), 1e-5),
    # matrix products
    ("mm and transposes", lambda x, y: (x @ y, y.t() @ x.t(), x[:1] @ y), (M1, M2), 1e-5),
    ("addmm", lambda b, x, y: (torch.addmm(b, x, y), torch.addmm(b, x, y, beta=0.5, alpha=2)),
     (r(6), M1, M2), 1e-5),
    ("linear grads", grads(F.linear), (A, r(7, 5), r(7)), 1e-5),
    ("bmm and matmul", lambda x, y, z: (torch.bmm(x, y), torch.matmul(x, z), x[:1] @ y[:1]),
     (r(2, 3, 4), r(2, 4, 5), r(4, 5)), 1e-5),
    ("outer products", lambda x, y: (x @ y, torch.bmm(x.unsqueeze(0), y.unsqueeze(0))),
     (r(3, 1), r(1, 4)), 1e-6),
    ("conv2d", lambda x, w, b: (F.conv2d(x, w, b, padding=1), F.conv2d(x, w, stride=2, dilation=2)),
     (X4, W4, B4), 1e-4),
    ("conv2d groups", lambda x, w: F.conv2d(x, w, groups=3), (r(2, 6, 5, 5), r(6, 2, 3, 3)), 1e-4),
    ("conv1d", lambda x, w: F.conv1d(x, w, padding=2), (r(2, 3, 10), r(4, 3, 3)), 1e-4),
    ("depthwise conv", lambda x, w, b, y, v: (
        F.conv1d(x, w, b, padding=3, groups=128),
        F.conv2d(y, v, stride=2, padding=1, groups=96),
        F.conv2d(y, v, dilation=2, padding=2, groups=96)),
     (r(2, 128, 12), r(128, 1, 4), r(128), r(2, 96, 9, 9), r(96, 1, 3, 3)), 1e-4),
    ("depthwise conv grads", grads(lambda x, w, b: F.conv1d(x, w, b, padding=3, groups=128)),
     (r(2, 128, 12), r(128, 1, 4), r(128)), 1e-4),
    ("depthwise conv2d grads", grads(lambda x, w: F.conv2d(x, w, stride=2, padding=1, groups=72)),
     (r(2, 72, 7, 7), r(72, 1, 3, 3)), 1e-4),
    ("conv2d grads", grads(lambda x, w, b: F.conv2d(x, w, b, padding=1)), (X4, W4, B4), 1e-4),
    # indexing and assembly
    ("embedding grads", lambda i, e: grads(lambda e: F.embedding(i, e, padding_idx=3))(e),
     (idx(10, 2, 3), r(10, 4)), 1e-6),
    ("index_select gather", lambda x, i, j: (x.index_select(1, i), x.gather(1, j), x[i.clamp(0, 3)]),
     (A, torch.tensor([4, 0, 0]), idx(5, 4, 2)), 0),
    ("scatter_add index_add", lambda x, j, s, i, t: (x.scatter_add(1, j, s), x.index_add(0, i, t)),
     (A, idx(5, 4, 2), r(4, 2), torch.tensor([0, 0, 3]), r(3, 5)), 1e-6),
    ("index_put accumulate", lambda x, i, j, k: (
        x.clone().index_put_((i,), x.new_ones(5), accumulate=True),
        torch.ops.aten.index_put(x, [None, j], x[:, :2] * 2, True),
        torch.ops.aten.index_put(x, [None, k], x.new_ones(4), True)),
     (A, torch.tensor([0, -1, 0]), torch.tensor([4, 4]), torch.tensor(2)), 1e-6),
    ("index_put accumulate grad", lambda x, i: grads(lambda x: x[:, i].square().sum())(x),
     (A, torch.tensor([1, 1, 3])), 1e-6),
    ("scatter value", lambda x, j, k: (x.scatter(1, j, 2.5), x.scatter(0, k, -1.0),
                                       torch.zeros_like(x).scatter_(1, j, 1.0)),
     (A, idx(5, 4, 2), torch.tensor([[0, 3, 3, 0, 1]])), 0),
    ("flip", lambda x, y: (x.flip(0), x.flip([0, 1]), x.t().flip(-1), y.flip(1)),
     (A, idx(5, 3, 4)), 0),
    ("cat stack tril", lambda x, y: (torch.cat([x, y], 1), torch.stack([x, x]), x.tril(), x.triu(1)),
     (A, C), 0),
    ("eye", lambda x: (torch.eye(4, device=x.device), torch.eye(3, 5, device=x.device),
                       torch.eye(5, 2, dtype=torch.int64, device=x.device),
                       torch.eye(0, 3, device=x.device), torch.eye(3, dtype=torch.bool,
                                                                  device=x.device)), (A,), 0),
    ("arange", lambda x: (torch.arange(2, 10, 3, device=x.device),
                          torch.arange(0, 1, 0.1, device=x.device)), (A,), 0),
    ("nll_loss", lambda x, t, w: [F.nll_loss(x, t, reduction=red) for red in ("mean", "sum", "none")]
     + [F.nll_loss(x, t, w)], (LOGP, TARGET, pos(5)), 1e-6),
    ("cross_entropy grads", lambda x, t: grads(lambda x: F.cross_entropy(x, t))(x),
     (r(6, 5), TARGET), 1e-6),
]


@pytest.mark.parametrize("name,fn,args,tol", CASES, ids=[c[0] for c in CASES])
def test_native_matches_cpu(name, fn, args, tol, fallback_log):
    expected = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    failures = torch_tern.kernel_cache_info()["failures"]
    actual = to(fn(*to(args, "tern")), "cpu")
    # Every program the op built was accepted by tern_executable_load, whose
    # checks include the static race check of the engine streams.
    info = torch_tern.kernel_cache_info()
    assert info["failures"] == failures, f"{name}: a program was refused: {info['last_error']}"
    assert fallback_log.get_fallback_ops() == {}, f"{name} fell back"
    close(actual, expected, tol)


def test_programs_are_cached_by_shape():
    torch_tern.kernel_cache_info()
    a = torch.randn(7, 3, device="tern")
    b = torch.randn(7, 3, device="tern")
    a + b
    before = torch_tern.kernel_cache_info()
    for _ in range(5):
        a + b
    after = torch_tern.kernel_cache_info()
    assert after["misses"] == before["misses"]
    assert after["hits"] >= before["hits"] + 5
    assert after["launches"] >= before["launches"] + 5


def test_cache_cleared_while_the_autograd_thread_runs_ops():
    # Backward runs on the device's autograd thread while Python is free to
    # clear the kernel cache; an executable it looked up must not be unloaded
    # before it is queued (it was: "executable is not a live executable
    # handle" within the first few steps, every run).
    import threading

    torch.manual_seed(0)
    cpu_model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)).to("tern")
    model.load_state_dict(cpu_model.state_dict())
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
    torch.nn.functional.cross_entropy(cpu_model(x), y).backward()
    xt, yt = x.to("tern"), y.to("tern")
    stop, clears = threading.Event(), [0]

    def clear_in_a_loop():
        while not stop.is_set():
            torch_tern._C._kernel_cache_clear()
            clears[0] += 1

    clearer = threading.Thread(target=clear_in_a_loop)
    clearer.start()
    try:
        for _ in range(100):
            model.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(xt), yt).backward()
            torch.tern.synchronize()
    finally:
        stop.set()
        clearer.join()
    assert clears[0] > 10
    for p, ref in zip(model.parameters(), cpu_model.parameters()):
        torch.testing.assert_close(p.grad.cpu(), ref.grad, rtol=1e-5, atol=1e-5)


def test_same_shape_elementwise_shares_one_program_per_count(fallback_log):
    # Same-shape, same-dtype, contiguous elementwise calls run a 1-D program
    # found by a compact key: one program per op and element count, whatever
    # the shape.
    a = torch.randn(4, 6, device="tern")
    b = torch.randn(4, 6, device="tern")
    (a - b).cpu()
    before = torch_tern.kernel_cache_info()
    results = [(a.view(shape) - b.view(shape)).cpu() for shape in [(24,), (2, 3, 4), (6, 4)]]
    after = torch_tern.kernel_cache_info()
    assert after["misses"] == before["misses"]
    assert after["hits"] >= before["hits"] + 3
    for shape, r in zip([(24,), (2, 3, 4), (6, 4)], results):
        assert torch.equal(r, (a.cpu() - b.cpu()).view(shape))


def test_elementwise_aliasing_in_place_and_overlap():
    base = torch.arange(12, dtype=torch.float32)
    # The same tensor twice (bound once), and in place.
    x = base.to("tern")
    assert torch.equal((x * x).cpu(), base * base)
    y = base.to("tern")
    y.add_(x)
    assert torch.equal(y.cpu(), base + base)
    z = base.to("tern")
    z.mul_(z)
    assert torch.equal(z.cpu(), base * base)
    z = base.to("tern")
    z.neg_()
    assert torch.equal(z.cpu(), -base)
    # An output overlapping an input elsewhere than in place is not taken by
    # the fast path: the general path declines it too, and the CPU fallback
    # computes it from copies of the inputs.
    w = base.to("tern")
    expected = base.clone()
    expected[2:8] = base[:6] + base[2:8]
    torch.add(w[:6], w[2:8], out=w[2:8])
    assert torch.equal(w.cpu(), expected)
    # Non-contiguous and broadcast operands take the general path.
    m = torch.randn(5, 4)
    n = torch.randn(4, 5)
    assert torch.equal((m.to("tern") + n.to("tern").t()).cpu(), m + n.t())
    assert torch.equal((m.to("tern") + m[0].to("tern")).cpu(), m + m[0])
    # Integer, bf16 and relu (a unary op).
    i = torch.arange(-6, 6, dtype=torch.int32)
    assert torch.equal((i.to("tern") * i.to("tern")).cpu(), i * i)
    h = torch.randn(9).to(torch.bfloat16)
    assert torch.equal((h.to("tern") + h.to("tern")).cpu(), h + h)
    assert torch.equal(torch.relu(m.to("tern")).cpu(), torch.relu(m))


def test_refused_elementwise_programs_are_not_rebuilt(fallback_log):
    # sign on bool has no tern instruction: the first call's programs are
    # refused (and cached as refused); later calls decline at once and take
    # the CPU fallback, building nothing.
    x = torch.tensor([True, False, True], device="tern")
    first = torch.sign(x).cpu()
    before = torch_tern.kernel_cache_info()
    again = torch.sign(x).cpu()
    after = torch_tern.kernel_cache_info()
    assert after["misses"] == before["misses"] and after["failures"] == before["failures"]
    assert torch.equal(first, torch.sign(x.cpu())) and torch.equal(again, first)
    assert fallback_log.get_fallback_ops() == {"aten::sign.out": 2}


def test_true_division_into_an_integer_out_raises_as_on_the_cpu():
    x = torch.arange(6, dtype=torch.int32)
    y = torch.full((6,), 4, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Int"):
        torch.div(x.clone(), y, out=x.clone())
    xt = x.to("tern")
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type Int"):
        torch.div(xt, y.to("tern"), out=xt)
    assert torch.equal(xt.cpu(), x)  # nothing written


def test_scalar_arguments_past_a_whole_ring_of_slots(fallback_log):
    # Each run's scalars go through a ring of slots per queue (256 of them);
    # queued faster than the queue runs them, the ring wraps around and later
    # runs must neither overwrite bytes a queued copy has yet to read nor
    # read another run's values.
    x = torch.linspace(-1, 1, 32)
    y = x.to("tern")
    # The stream waits for a long product on another stream, so that every
    # run below is queued before any of them runs.
    side = torch.tern.Stream()
    big = torch.randn(2048, 2048, device="tern")
    side.wait_stream(torch.tern.current_stream())
    with torch.tern.stream(side):
        product = big @ big
    torch.tern.current_stream().wait_stream(side)
    for i in range(1500):  # bounded values, each run's scalars its own
        x = x * (1 - (i % 7) * 1e-3) + (i % 13) * 1e-2
        y = y * (1 - (i % 7) * 1e-3) + (i % 13) * 1e-2
    torch.testing.assert_close(y.cpu(), x, rtol=1e-5, atol=1e-5)
    del product


def test_scalar_arguments_from_two_threads_on_one_stream(fallback_log):
    import threading

    inputs = [torch.randn(64) for _ in range(2)]
    results = [None, None]
    stream = torch.tern.current_stream()

    def work(k):
        with torch.tern.stream(stream):
            t = inputs[k].to("tern")
            for i in range(400):
                t = t * 0.5 + (k + i)
            results[k] = t.cpu()

    threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    for k in range(2):
        expected = inputs[k].clone()
        for i in range(400):
            expected = expected * 0.5 + (k + i)
        torch.testing.assert_close(results[k], expected, rtol=1e-6, atol=1e-5)


def test_scalar_arguments_do_not_rebuild(fallback_log):
    # Scalars travel as run-time arguments: new values reuse the program.
    x = torch.ones(8, device="tern")
    x * 0.5
    before = torch_tern.kernel_cache_info()["misses"]
    results = [(x * (i + 0.25)).cpu() for i in range(10)]
    assert torch_tern.kernel_cache_info()["misses"] == before
    for i, res in enumerate(results):
        assert torch.equal(res, torch.full((8,), i + 0.25))


def test_float32_tensor_and_a_number_match_the_cpu(fallback_log):
    # A float32 tensor and a Python number (or a CPU scalar tensor) take a
    # fast path that passes the value at run time without building a Program
    # (elementwise.cc); every kind of value, in place, out= and functional,
    # must give the CPU's bits, and a second value must not build again.
    base = torch.linspace(-3, 3, 40)
    x = base.to("tern")
    numbers = [0.999, -2, True, 1e-30, float("inf"), torch.tensor(0.25, dtype=torch.float64),
               torch.tensor(3), torch.tensor(0.5, dtype=torch.float32)]
    x * 0.5
    before = torch_tern.kernel_cache_info()["misses"]
    for v in numbers:
        for op in (torch.mul, torch.add, torch.div) + (() if v is True else (torch.sub,)):
            assert torch.equal(op(x, v).cpu(), op(base, v)), (op, v)
        y, yc = x.clone(), base.clone()
        y.mul_(v)
        yc.mul_(v)
        assert torch.equal(y.cpu(), yc), v
        out = torch.empty(40, device="tern")
        torch.add(x, v, out=out)
        assert torch.equal(out.cpu(), torch.add(base, v)), v
    # Two float32 tensors with an alpha (an optimizer's `p.add_(buf, alpha=-lr)`):
    # tern multiplies, then adds (two roundings, as its general path); the CPU
    # fuses the two, so the last bit may differ.
    other = torch.linspace(5, -1, 40)
    o = other.to("tern")
    close = dict(rtol=1e-6, atol=1e-7)
    for alpha in (-0.01, 3, 0.5, -2.5e-8):
        for op in (torch.add, torch.sub):
            torch.testing.assert_close(op(x, o, alpha=alpha).cpu(), op(base, other, alpha=alpha),
                                       **close)
        y, yc = x.clone(), base.clone()
        y.add_(o, alpha=alpha)
        yc.add_(other, alpha=alpha)
        torch.testing.assert_close(y.cpu(), yc, **close)
        y.sub_(y, alpha=alpha)  # the same tensor twice, in place
        yc.sub_(yc, alpha=alpha)
        torch.testing.assert_close(y.cpu(), yc, **close)
        # The general path (a broadcast operand) computes the same bits.
        wide = torch.add(x.expand(2, 40), o, alpha=alpha)[1]
        assert torch.equal(torch.add(x, o, alpha=alpha).cpu(), wide.cpu()), alpha
    # New values, no new programs beyond one per op and variant.
    assert torch_tern.kernel_cache_info()["misses"] <= before + 16
    # Two 0-dim operands promote by dtype alone: a float32 0-dim tensor and a
    # float64 CPU scalar tensor give float64, computed as the CPU does.
    z = torch.tensor(1.1, dtype=torch.float32)
    w = torch.tensor(1 / 3, dtype=torch.float64)
    got = z.to("tern") * w
    assert got.dtype == torch.float64 and torch.equal(got.cpu(), z * w)


def test_optimizer_float_ops_fast_path_matches_the_general_path(fallback_log):
    # lerp, addcmul and addcdiv over float32 tensors of one shape take the
    # elementwise fast path with their scalar passed at run time; their bits
    # must be the general path's (a broadcast operand forces that path) and
    # close to the CPU's, in place too, for new values without new programs.
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randn(50, generator=g) for _ in range(3))
    c = c.abs() + 0.5
    ta, tb, tc = a.to("tern"), b.to("tern"), c.to("tern")
    close = dict(rtol=1e-6, atol=1e-6)

    def general(fn, *args, **kw):  # the same op with a broadcast first operand
        return fn(*(x.expand(2, 50) for x in args), **kw)[1]

    torch.lerp(ta, tb, 0.1), torch.addcmul(ta, tb, tc, value=0.1)
    before = torch_tern.kernel_cache_info()["misses"]
    for w in (0.1, 0.9, -0.3, 0.5, 2.0):
        got = torch.lerp(ta, tb, w)
        assert torch.equal(got.cpu(), general(torch.lerp, ta, tb, weight=w).cpu()), w
        torch.testing.assert_close(got.cpu(), torch.lerp(a, b, w), **close)
    for v in (0.1, -1e-3, 2, 0.999):
        for fn in (torch.addcmul, torch.addcdiv):
            got = fn(ta, tb, tc, value=v)
            assert torch.equal(got.cpu(), general(fn, ta, tb, tc, value=v).cpu()), (fn, v)
            torch.testing.assert_close(got.cpu(), fn(a, b, c, value=v), **close)
    # In place, a tensor twice (Adam's exp_avg_sq.addcmul_(grad, grad, ...)).
    s, sc = ta.clone(), a.clone()
    s.addcmul_(tb, tb, value=0.001)
    sc.addcmul_(b, b, value=0.001)
    s.lerp_(tc, 0.1)
    sc.lerp_(c, 0.1)
    s.addcdiv_(tb, tc, value=-0.01)
    sc.addcdiv_(b, c, value=-0.01)
    torch.testing.assert_close(s.cpu(), sc, **close)
    assert torch_tern.kernel_cache_info()["misses"] <= before + 12


def test_foreach_optimizer_ops_fuse_each_tensor_into_one_instruction(fallback_log, tmp_path):
    # _foreach_lerp_, _foreach_addcmul_, _foreach_addcdiv_ and _foreach_add_
    # with alpha (what torch.optim's AdamW and SGD call) run each tensor's
    # steps as one ELEMENTWISE instruction: the bits of the single-tensor ops,
    # close to the CPU's.
    g = torch.Generator().manual_seed(5)
    shapes = [(50,), (7, 9), (3, 4, 5)]
    xs = [torch.randn(s, generator=g) for s in shapes]
    ys = [torch.randn(s, generator=g) for s in shapes]
    zs = [torch.randn(s, generator=g).abs() + 0.5 for s in shapes]
    close = dict(rtol=1e-6, atol=1e-6)

    def tern(tensors):
        return [t.to("tern") for t in tensors]

    def check(fused, one_by_one, cpu):
        for got, want, expected in zip(fused, one_by_one, cpu):
            assert torch.equal(got.cpu(), want.cpu())
            torch.testing.assert_close(got.cpu(), expected, **close)

    for w in (0.1, 0.9):
        a, r, c = tern(xs), tern(xs), [x.clone() for x in xs]
        torch._foreach_lerp_(a, tern(ys), w)
        for p, q, y in zip(r, c, ys):
            p.lerp_(y.to("tern"), w)
            q.lerp_(y, w)
        check(a, r, c)
    for v in (0.1, -2.0):
        for name in ("addcmul_", "addcdiv_"):
            a, r, c = tern(xs), tern(xs), [x.clone() for x in xs]
            getattr(torch, "_foreach_" + name)(a, tern(ys), tern(zs), value=v)
            for p, q, y, z in zip(r, c, ys, zs):
                getattr(p, name)(y.to("tern"), z.to("tern"), value=v)
                getattr(q, name)(y, z, value=v)
            check(a, r, c)
        a, r, c = tern(xs), tern(xs), [x.clone() for x in xs]
        torch._foreach_add_(a, tern(ys), alpha=v)
        for p, q, y in zip(r, c, ys):
            p.add_(y.to("tern"), alpha=v)
            q.add_(y, alpha=v)
        check(a, r, c)
    # One instruction per tensor, of the fused kind.
    a, b = tern(xs), tern(ys)
    torch.tern.synchronize()
    path = tmp_path / "trace.json"
    with torch.tern.profiler.profile(path):
        torch._foreach_lerp_(a, b, 0.3)
        torch.tern.synchronize()
    events = json.loads(path.read_text())["traceEvents"]
    kinds = [e["args"]["opcode"] for e in events if e.get("ph") == "X" and e.get("cat") != "queue"]
    assert kinds == ["elementwise"] * len(shapes), kinds


def test_one_element_tensor_broadcast_matches_the_cpu(fallback_log):
    # A 0-dim tern tensor against a whole tensor (clip_grad_norm_'s
    # `g.mul_(clip_coef)`) takes the elementwise fast path, the 0-dim operand
    # broadcast; in every dtype and position, the CPU's bits.
    base = torch.linspace(-2, 2, 30)
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        x = (base * 10).to(dtype) if dtype == torch.int32 else base.to(dtype)
        s = torch.tensor(3, dtype=dtype) if dtype == torch.int32 else torch.tensor(0.37, dtype=dtype)
        tx, ts = x.to("tern"), s.to("tern")
        assert torch.equal((tx * ts).cpu(), x * s), dtype
        assert torch.equal((ts - tx).cpu(), s - x), dtype
        y, yc = tx.clone(), x.clone()
        y.add_(ts)
        yc.add_(s)
        assert torch.equal(y.cpu(), yc), dtype
    # An element of the output itself is refused before any kernel, as on the CPU.
    z = base.to("tern")
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        z.mul_(z[3])
    assert torch.equal(z.cpu(), base)
    # One element under two shapes (0-dim and [1]) at one address.
    one = torch.tensor(1.5, device="tern")
    assert torch.equal(torch.add(one, one.view(1)).cpu(), torch.tensor([3.0]))
    assert torch.equal(torch.mul(one.view(1), one).cpu(), torch.tensor([2.25]))
    # A 0-dim input alone never stretches an output: the general path resizes
    # it, as on the CPU (with its warning).
    v, vc = torch.empty(5, device="tern"), torch.empty(5)
    with pytest.warns(UserWarning):
        torch.neg(torch.tensor(2.0, device="tern"), out=v)
    with pytest.warns(UserWarning):
        torch.neg(torch.tensor(2.0), out=vc)
    assert v.shape == vc.shape and torch.equal(v.cpu(), vc)
    # With a run-time scalar and an alpha, and in lerp and addcmul.
    tx, ts = base.to("tern"), torch.tensor(0.37, device="tern")
    torch.testing.assert_close(torch.add(tx, ts, alpha=-0.5).cpu(),
                               torch.add(base, torch.tensor(0.37), alpha=-0.5), rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(torch.lerp(tx, ts.expand(30), 0.2).cpu(),
                               torch.lerp(base, torch.tensor(0.37).expand(30), 0.2))
    torch.testing.assert_close(torch.addcmul(tx, ts, tx, value=0.5).cpu(),
                               torch.addcmul(base, torch.tensor(0.37), base, value=0.5))


def test_declined_kernels_fall_back(fallback_log):
    # float64 tanh: not among the ISA's f64 functions, so the native kernel
    # declines and the CPU runs it.
    x = torch.arange(6, dtype=torch.float64).to("tern")
    assert torch.equal(x.tanh().cpu(), torch.arange(6, dtype=torch.float64).tanh())
    assert fallback_log.get_fallback_ops() == {"aten::tanh.out": 1}


def test_execution_error_is_raised_with_the_op():
    table = torch.randn(4, 3, device="tern")
    bad = torch.tensor([0, 7], device="tern")
    with pytest.raises(RuntimeError, match="index_select"):
        table.index_select(0, bad).cpu()
    # the stream stays usable
    assert torch.equal((torch.ones(2, device="tern") * 3).cpu(), torch.full((2,), 3.0))
