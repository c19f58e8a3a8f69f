"""kr_cpu.h, the helper library of generated CPU kernels (csrc/keraunos/codegen/device/): each
helper, compiled into a small kernel with the kernels' flags, against eager torch on wide input
ranges and special values (inf, NaN, -0, subnormals, huge). Transcendentals within
assert_close's default tolerances; rounding, sign, min/max, fmod, remainder, floor_divide and
the 16-bit conversions bit for bit."""

import math

import pytest
import torch

from keraunos import _C

pytestmark = pytest.mark.skipif(
    not _C.cpu_compiler_info()["available"], reason="no C++ compiler for CPU kernels"
)

CTYPE = {
    torch.float32: "float",
    torch.float64: "double",
    torch.int8: "int8_t",
    torch.int16: "int16_t",
    torch.int32: "int32_t",
    torch.int64: "int64_t",
    torch.uint8: "uint8_t",
    torch.bool: "bool",
}
FLOATS = (torch.float32, torch.float64)
INTS = (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)

# name -> eager reference
TOLERANT = {
    "exp": torch.exp,
    "exp2": torch.exp2,
    "expm1": torch.expm1,
    "log": torch.log,
    "log2": torch.log2,
    "log1p": torch.log1p,
    "sin": torch.sin,
    "cos": torch.cos,
    "tan": torch.tan,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "erf": torch.erf,
    "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal,
}
EXACT = {
    "floor": torch.floor,
    "ceil": torch.ceil,
    "round": torch.round,
    "trunc": torch.trunc,
    "sign": torch.sign,
    "abs": torch.abs,
}
PREDICATES = {"isnan": torch.isnan, "isinf": torch.isinf}
BINARY_EXACT = {
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "fmod": torch.fmod,
    "remainder": torch.remainder,
    "floor_divide": torch.floor_divide,
}


def _unary(name, fn, dt, out_dt=None):
    a, b = CTYPE[dt], CTYPE[out_dt or dt]
    return f"""
extern "C" void {name}(void** p, const int64_t* args) {{
  const {a}* x = static_cast<const {a}*>(p[0]);
  {b}* y = static_cast<{b}*>(p[1]);
  for (int64_t i = 0; i < args[0]; ++i) y[i] = {fn}(x[i]);
}}"""


def _binary(name, fn, dt):
    c = CTYPE[dt]
    return f"""
extern "C" void {name}(void** p, const int64_t* args) {{
  const {c}* a = static_cast<const {c}*>(p[0]);
  const {c}* b = static_cast<const {c}*>(p[1]);
  {c}* y = static_cast<{c}*>(p[2]);
  for (int64_t i = 0; i < args[0]; ++i) y[i] = {fn}(a[i], b[i]);
}}"""


def _kernels():
    src = [_C._embedded_file("kr_cpu.h")]
    for dt in FLOATS:
        c = CTYPE[dt]
        for name in (*TOLERANT, *EXACT):
            src.append(_unary(f"{name}_{c}", f"kr_{name}", dt))
        for name in PREDICATES:
            src.append(_unary(f"{name}_{c}", f"kr_{name}", dt, torch.bool))
        for name in (*BINARY_EXACT, "pow"):
            src.append(_binary(f"{name}_{c}", f"kr_{name}", dt))
    for dt in (*INTS, torch.bool):
        c = CTYPE[dt]
        for name in ("abs", "sign"):
            src.append(_unary(f"{name}_{c}", f"kr_{name}", dt))
        for name in PREDICATES:
            src.append(_unary(f"{name}_{c}", f"kr_{name}", dt, torch.bool))
        for name in ("maximum", "minimum"):
            src.append(_binary(f"{name}_{c}", f"kr_{name}", dt))
    src.append(_unary("h2f", "kr_h2f", torch.int16, torch.float32).replace("int16_t", "uint16_t"))
    src.append(_unary("bf2f", "kr_bf2f", torch.int16, torch.float32).replace("int16_t", "uint16_t"))
    src.append(_unary("f2h", "kr_f2h", torch.float32, torch.int16).replace("int16_t", "uint16_t"))
    src.append(_unary("f2bf", "kr_f2bf", torch.float32, torch.int16).replace("int16_t", "uint16_t"))
    return "\n".join(src)


# "flags": as kernels are built (glibc's vector math for sin, cos, tan and erf where the
# compiler probe kept it); "own": kr_cpu.h's own helpers, as on a machine without it.
@pytest.fixture(scope="module", params=["flags", "own"])
def lib(request):
    prefix = "#undef KR_HAVE_MVEC\n" if request.param == "own" else ""
    return _C.cpu_compile(prefix + _kernels())


def run(lib, symbol, out_dtype, *inputs):
    inputs = [t.contiguous() for t in inputs]
    out = torch.empty(inputs[0].shape, dtype=out_dtype)
    lib.call(symbol, [t.data_ptr() for t in inputs] + [out.data_ptr()], [out.numel()])
    return out


def special_values(dt):
    fi = torch.finfo(dt)
    v = [0.0, -0.0, math.inf, -math.inf, math.nan, fi.tiny, -fi.tiny, fi.max, -fi.max]
    v += [fi.smallest_normal / 2**k for k in (1, 5, 20)]
    v += [
        x * s
        for x in (0.5, 1.5, 2.5, 3.5, 1.0, 2.0, 1e-3, 88.7, 88.8, 89.5, -103.9, 709.7)
        for s in (1, -1)
    ]
    v += [math.pi * k / 4 for k in range(-16, 17)]
    return torch.tensor(v, dtype=dt)


def inputs(dt):
    g = torch.Generator().manual_seed(0)
    top = 38 if dt == torch.float32 else 307
    mag = torch.logspace(-top - 7, top, 30000, dtype=torch.float64)
    parts = [
        special_values(dt),
        mag.to(dt),
        -mag.to(dt),
        torch.linspace(-20, 20, 40001, dtype=dt),
        torch.linspace(-110, 110, 20001, dtype=dt),
        torch.randn(20000, generator=g, dtype=dt) * 5,
        torch.rand(20000, generator=g, dtype=dt),
    ]
    return torch.cat(parts)


def assert_bitwise(ours, ref):
    assert ours.dtype == ref.dtype
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(ours), nan)
    bits = {torch.float32: torch.int32, torch.float64: torch.int64}.get(ref.dtype)
    if bits is None:
        assert torch.equal(ours, ref)
        return
    bad = (ours.view(bits) != ref.view(bits)) & ~nan
    assert not bad.any(), f"{int(bad.sum())} differ, e.g. at {ref[bad][:5]} vs {ours[bad][:5]}"


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(TOLERANT))
def test_transcendental(lib, name, dt):
    x = inputs(dt)
    ours = run(lib, f"{name}_{CTYPE[dt]}", dt, x)
    torch.testing.assert_close(ours, TOLERANT[name](x), equal_nan=True)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_unary(lib, name, dt):
    x = inputs(dt)
    assert_bitwise(run(lib, f"{name}_{CTYPE[dt]}", dt, x), EXACT[name](x))


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(PREDICATES))
def test_predicates(lib, name, dt):
    x = inputs(dt)
    assert torch.equal(run(lib, f"{name}_{CTYPE[dt]}", torch.bool, x), PREDICATES[name](x))


def binary_inputs(dt):
    s = special_values(dt)
    a, b = torch.meshgrid(s, s, indexing="ij")
    g = torch.Generator().manual_seed(1)
    r = torch.randn(2, 50000, generator=g, dtype=torch.float64) * 10
    r[1, :25000] = torch.randn(25000, generator=g, dtype=torch.float64) * 0.1
    ints = torch.randint(-40, 40, (2, 20000), generator=g).to(torch.float64)
    ints[1][ints[1] == 0] = 3
    a = torch.cat([a.flatten(), r[0].to(dt), ints[0].to(dt), (r[0] * 1e30).to(dt)])
    b = torch.cat([b.flatten(), r[1].to(dt), ints[1].to(dt), (r[1] * 1e-8).to(dt)])
    return a, b


@pytest.mark.parametrize("dt", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY_EXACT))
def test_binary_exact(lib, name, dt):
    a, b = binary_inputs(dt)
    ours = run(lib, f"{name}_{CTYPE[dt]}", dt, a, b)
    ref = BINARY_EXACT[name](a, b)
    if name in ("maximum", "minimum"):  # which zero comes back is not specified
        ours, ref = ours + 0.0, ref + 0.0
    if name in ("fmod", "remainder"):
        # Eager's vectorized fmod (SLEEF) returns NaN where a / b overflows; its scalar path
        # (and C's fmod, which kr_fmod is) gives the exact remainder. Compare those with C.
        q = torch.isinf(a / b) & torch.isfinite(a) & (b != 0)
        c = torch.tensor([math.fmod(x, y) for x, y in zip(a[q].tolist(), b[q].tolist())], dtype=dt)
        if name == "remainder":
            c = torch.where((c != 0) & ((c < 0) != (b[q] < 0)), c + b[q], c)
        assert_bitwise(ours[q], c)
        ours, ref = ours[~q], ref[~q]
    assert_bitwise(ours, ref)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_pow(lib, dt):
    a, b = binary_inputs(dt)
    b = torch.cat([b[: len(b) // 2], b[len(b) // 2 :].round()])
    torch.testing.assert_close(
        run(lib, f"pow_{CTYPE[dt]}", dt, a, b), torch.pow(a, b), equal_nan=True
    )


@pytest.mark.parametrize("dt", (*INTS, torch.bool), ids=str)
def test_integer_ops(lib, dt):
    c = CTYPE[dt]
    if dt == torch.bool:
        a = torch.tensor([True, False, True, False])
        b = torch.tensor([True, True, False, False])
    else:
        info = torch.iinfo(dt)
        g = torch.Generator().manual_seed(2)
        a = torch.randint(info.min, info.max, (5000,), generator=g, dtype=dt)
        a[:4] = torch.tensor([info.min, info.max, 0, 1 if info.min == 0 else -1], dtype=dt)
        b = torch.randint(info.min, info.max, (5000,), generator=g, dtype=dt)
    if dt != torch.bool:  # torch has no abs/sign for bool
        assert torch.equal(run(lib, f"abs_{c}", dt, a), torch.abs(a))
        assert torch.equal(run(lib, f"sign_{c}", dt, a), torch.sign(a))
    for name in PREDICATES:
        assert not run(lib, f"{name}_{c}", torch.bool, a).any()
    assert torch.equal(run(lib, f"maximum_{c}", dt, a, b), torch.maximum(a, b))
    assert torch.equal(run(lib, f"minimum_{c}", dt, a, b), torch.minimum(a, b))


def all_float_samples():
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-(2**31), 2**31 - 1, (1 << 20,), generator=g, dtype=torch.int32)
    x = x.view(torch.float32)
    edges = torch.tensor(
        [
            65504.0,
            65519.99,
            65520.0,
            65536.0,
            2**-24,
            2**-25,
            2**-25 * 1.0001,
            2**-14,
            2**-14 * (1 - 2**-11),
            3 * 2**-26,
            1e-8,
        ],
        dtype=torch.float64,
    )
    # Ties: halfway between neighbouring halves (exactly representable in float32).
    h = torch.arange(0, 1 << 15, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    ties = (h[:-1].double() + h[1:].double()) / 2
    return torch.cat(
        [
            x,
            special_values(torch.float32),
            edges.float(),
            -edges.float(),
            ties.float(),
            -ties.float(),
            torch.linspace(-70000, 70000, 100001),
        ]
    )


def test_half_conversions(lib):
    h = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    assert_bitwise(run(lib, "h2f", torch.float32, h), h.view(torch.float16).float())
    x = all_float_samples()
    ours = run(lib, "f2h", torch.int16, x).view(torch.float16)
    ref = x.half()
    assert torch.equal(torch.isnan(ours), torch.isnan(ref))
    ok = ~torch.isnan(ref)
    assert torch.equal(ours.view(torch.int16)[ok], ref.view(torch.int16)[ok])


def test_bfloat16_conversions(lib):
    h = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    assert_bitwise(run(lib, "bf2f", torch.float32, h), h.view(torch.bfloat16).float())
    x = all_float_samples()
    ours = run(lib, "f2bf", torch.int16, x)
    ref = x.bfloat16()
    nan = torch.isnan(ref)
    assert torch.equal(torch.isnan(ours.view(torch.bfloat16)), nan)
    assert torch.equal(ours[~nan], ref.view(torch.int16)[~nan])
    # c10::BFloat16's scalar conversion: every NaN becomes 0x7fc0.
    assert (ours[nan] == 0x7FC0).all()


def test_embedded_file():
    text = _C._embedded_file("kr_cpu.h")
    assert "kr_exp" in text and text.endswith("\n")
    with pytest.raises(AssertionError, match="no embedded device file"):
        _C._embedded_file("no_such_file.h")


# Helpers whose loops stay scalar by design (libm's fmod, exact as eager's, and what uses it).
SCALAR = {"fmod", "remainder", "floor_divide"}


@pytest.mark.skipif(
    "clang" in _C.cpu_compiler_info()["identity"].lower(), reason="-fopt-info is GCC's"
)
def test_float_helpers_vectorize(tmp_path):
    """Every float32 helper of the transcendental chains vectorizes with the kernels' flags:
    GCC leaves a whole loop scalar for one operation the target cannot do in vector registers
    (kr_pow's int64 -> double exponent: pow5 took 1,100 ms instead of 285 ms on an AVX2 host)."""
    import subprocess

    info = _C.cpu_compiler_info()
    names = [*TOLERANT, "pow", *(n for n in BINARY_EXACT if n not in SCALAR)]
    body = [_C._embedded_file("kr_cpu.h")]
    loop_line = {}  # source line of each helper's loop -> its name
    for i, name in enumerate(names):
        loop_line[sum(b.count("\n") + 1 for b in body) + 3] = name
        args = "a[i], a[i] * 0.5f" if name == "pow" or name in BINARY_EXACT else "a[i]"
        body.append(
            f'extern "C" void t{i}(const float* __restrict__ a, float* __restrict__ y, long n) {{\n'
            f"#pragma omp simd\n  for (long i = 0; i < n; ++i) y[i] = kr_{name}({args});\n}}"
        )
    src = tmp_path / "helpers.cpp"
    src.write_text("\n".join(body))
    flags = [f for f in info["flags"] if not f.startswith("-Wl,") and not f.startswith("-l")]
    r = subprocess.run(
        [info["path"], *flags, "-fopt-info-vec-missed", "-o", str(tmp_path / "h.so"), str(src)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    lines = src.read_text().splitlines()
    scalar = []
    for ln in r.stderr.splitlines():
        if "couldn't vectorize loop" not in ln or "helpers.cpp:" not in ln:
            continue
        at = int(ln.split("helpers.cpp:")[1].split(":")[0])
        scalar.append(loop_line.get(at, f"line {at}"))
    assert all(lines[k - 1].lstrip().startswith("for") for k in loop_line), "loop lines"
    assert not scalar, f"scalar loops: {scalar}"
