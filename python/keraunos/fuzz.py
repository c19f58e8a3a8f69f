"""Differential fuzzer: random programs mixing views, in-place ops, copy_, setitem,
out-of-place math, reductions, aliased inputs and returns of views, run eagerly and through
keraunos.jit, compared on (a) outputs, (b) the contents of every input after the call and
(c) which outputs alias which inputs and outputs.

    python -m keraunos.fuzz --programs 20000 --fusion-type dataflow --seed 0

Programs are plain Python source, generated line by line: a candidate line is kept only if
eager runs it, so every program is valid PyTorch. A failure is shrunk (lines removed while it
still fails) and printed as a standalone reproducer."""

from __future__ import annotations

import argparse
import random
import sys
import time

import torch

# Input patterns: (source lines building `args`, names of the parameters).
_INPUT_PATTERNS = [
    (["a = torch.randn(4, 6, device=dev)", "args = (a,)"], 1),
    (["a = torch.randn(4, 6, device=dev)", "b = torch.randn(6, device=dev)", "args = (a, b)"], 2),
    (["a = torch.randn(4, 6, device=dev)", "args = (a, a)"], 2),  # the same tensor twice
    (["base = torch.randn(4, 6, device=dev)", "args = (base[:2], base[2:])"], 2),  # disjoint views
    (
        ["base = torch.randn(4, 6, device=dev)", "args = (base[:3], base[1:])"],
        2,
    ),  # overlapping views
    (["base = torch.randn(4, 6, device=dev)", "args = (base, base[1])"], 2),  # a base and its view
    (
        [
            "a = torch.randn(6, 4, device=dev).t()",
            "b = torch.randn(4, 6, device=dev)",
            "args = (a, b)",
        ],
        2,
    ),  # transposed
    (
        [
            "a = torch.randn(2, 3, 4, device=dev)",
            "b = torch.randn(4, device=dev)",
            "c = torch.randn(3, 4, device=dev)",
            "args = (a, b, c)",
        ],
        3,
    ),
    (["a = torch.randn(8, 6, device=dev)[::2]", "args = (a,)"], 1),  # strided
]

_UNARY = ["sin", "cos", "exp", "tanh", "sigmoid", "abs", "neg", "relu"]
_REDUCE = ["sum", "mean", "amax", "amin"]


class Program:
    def __init__(self, rng: random.Random, n_inputs: int, setup: list[str]):
        self.device = "cpu"
        self.rng = rng
        self.setup = setup
        self.params = [f"x{i}" for i in range(n_inputs)]
        self.grad = False  # inputs require grad; the backward is compared too
        self.lines: list[str] = []
        self.returns: list[str] = []

    def source(self, lines=None, returns=None) -> str:
        lines = self.lines if lines is None else lines
        returns = self.returns if returns is None else returns
        body = "\n".join(f"    {ln}" for ln in lines) or "    pass"
        ret = ", ".join(returns)
        return f"def f({', '.join(self.params)}):\n{body}\n    return ({ret}{',' if len(returns) == 1 else ''})\n"


def _make_args(setup, device="cpu", grad=False):
    ns = {"torch": torch, "dev": device}
    exec("\n".join(setup), ns)
    if grad:  # every input a leaf that requires grad (views keep sharing their storage)
        return tuple(a.detach().requires_grad_() for a in ns["args"])
    return ns["args"]


def _compile(src):
    ns = {"torch": torch}
    exec(src, ns)
    return ns["f"]


def _vars_of(prog: Program, ns_vals: dict) -> list[str]:
    return [k for k, v in ns_vals.items() if isinstance(v, torch.Tensor)]


def _candidate(prog: Program, tensors: dict, fresh: str) -> str:
    rng = prog.rng
    names = list(tensors)
    x = rng.choice(names)
    t = tensors[x]
    y = rng.choice(names)
    nd = t.dim()
    d = rng.randrange(nd) if nd else 0
    kind = rng.random()
    if prog.grad and 0.30 <= kind < 0.55:
        # With gradients, in-place lines are rarer (a write involving a tensor that requires
        # grad runs the program as recorded through torch): most programs exercise the
        # compiled forward and backward.
        kind += 0.30
    if kind < 0.30:  # views
        opts = [
            f"{fresh} = {x}.view(-1)",
            f"{fresh} = {x}[1:]",
            f"{fresh} = {x}[::2]",
            f"{fresh} = {x}.unsqueeze(0)",
            f"{fresh} = {x}.reshape(-1)",
        ]
        if nd >= 1:
            opts += [
                f"{fresh} = {x}[0]",
                f"{fresh} = {x}.narrow({d}, 0, 1)",
                f"{fresh} = {x}.select({d}, -1)",
                f"{fresh} = {x}.chunk(2, {d})[0]",
                f"{fresh} = {x}[..., 1:]",
            ]
        if nd >= 2:
            opts += [
                f"{fresh} = {x}.t()" if nd == 2 else f"{fresh} = {x}.transpose(0, 1)",
                f"{fresh} = {x}.diagonal()",
                f"{fresh} = {x}[:, 1]",
                f"{fresh} = {x}.permute({', '.join(str(i) for i in reversed(range(nd)))})",
            ]
        return rng.choice(opts)
    if kind < 0.60:  # in-place
        opts = [
            f"{x}.add_({y})",
            f"{x}.mul_(2)",
            f"{x}.sin_()",
            f"{x}.copy_({y})",
            f"{x}.zero_()",
            f"{x}.fill_(1.5)",
            f"{x}.clamp_(-0.5, 0.5)",
            f"{x}.sub_({y}, alpha=2)",
            f"{x}.masked_fill_({x} > 0, 0.25)",
            f"{x} += 1",
            f"{x}.relu_()",
            f"{x}.exp_()",
        ]
        if nd >= 1:
            opts += [
                f"{x}[0] = {y}" if rng.random() < 0.5 else f"{x}[0] = 3.0",
                f"{x}[1:] = 0.5",
                f"{x}[..., :1] = {y}[..., :1]",
            ]
        return rng.choice(opts)
    if kind < 0.90:  # out-of-place math
        opts = [
            f"{fresh} = {x} + {y}",
            f"{fresh} = {x} * {y}",
            f"{fresh} = {x}.{rng.choice(_UNARY)}()",
            f"{fresh} = torch.where({x} > 0, {x}, {y})",
            f"{fresh} = {x} * 2 - 1",
            f"{fresh} = {x}.clone()",
            f"{fresh} = ({x} + 1).view(-1)",
        ]
        if nd >= 1:
            opts += [
                f"{fresh} = {x}.{rng.choice(_REDUCE)}({d}, keepdim={rng.random() < 0.5})",
                f"{fresh} = {x}.softmax({d})",
                f"{fresh} = {x}.cumsum({d})",
                f"{fresh} = ({x} * 2 + 1).cumsum({d}, dtype=torch.float64).float()",
                f"{fresh} = {x}.{rng.choice(['argmax', 'argmin'])}({d}, keepdim={rng.random() < 0.5})",
                f"{fresh} = ({x} * 2 - {y}).argmax(-1, keepdim=True) + {x}",
                f"{fresh} = {x}.relu().argmin()",
                f"{fresh} = torch.cat([{x}, {x} * 2], {d})",
                f"{fresh} = torch.cat([-{x}[..., 1:], {x}[..., :1].exp()], -1)",
                f"{fresh} = torch.stack([{x}, {x}.sin()], {rng.randrange(nd + 1)})",
                f"{fresh} = {x}[[0, -1, 0]] * 2",
                f"{fresh} = ((({x} * 10).long() // 3) % 5).float() + {x}",
            ]
        return rng.choice(opts)
    return f"{fresh} = torch.randn({tuple(t.shape)}, device={prog.params[0]}.device)"


def generate(seed: int, max_lines: int = 10, device: str = "cpu", grad: bool = False) -> Program:
    rng = random.Random(seed)
    setup, n = rng.choice(_INPUT_PATTERNS)
    prog = Program(rng, n, setup)
    prog.device = device
    prog.grad = grad
    torch.manual_seed(seed)
    args = _make_args(setup, device, grad)
    n_lines = rng.randint(1, max_lines)
    counter = 0
    attempts = 0
    while len(prog.lines) < n_lines and attempts < n_lines * 8:
        attempts += 1
        ns = {"torch": torch}
        ns.update({p: a for p, a in zip(prog.params, _clone(args))})
        try:
            exec("\n".join(prog.lines), ns)
        except Exception:  # pragma: no cover - the prefix always runs
            break
        tensors = {k: v for k, v in ns.items() if isinstance(v, torch.Tensor)}
        fresh = f"v{counter}"
        line = _candidate(prog, tensors, fresh)
        try:
            exec(line, ns)
        except Exception:
            continue
        try:
            finite = all(
                torch.isfinite(v).all()
                for v in ns.values()
                if isinstance(v, torch.Tensor) and v.is_floating_point()
            )
        except RuntimeError:  # autograd refuses to read a view whose base was written
            finite = False
        if not finite:
            continue
        prog.lines.append(line)
        counter += 1
    ns = {"torch": torch}
    ns.update({p: a for p, a in zip(prog.params, _clone(args))})
    exec("\n".join(prog.lines), ns)
    names = [k for k, v in ns.items() if isinstance(v, torch.Tensor)]
    k = rng.randint(1, min(3, len(names)))
    prog.returns = rng.sample(names, k)
    return prog


def _clone(args):
    from .testing import clone_args

    return clone_args(args)


def run_one(
    prog: Program, seed: int, fusion_type: str, via: str = "jit", info: dict | None = None
) -> str | None:
    """None when keraunos agrees with eager, else a description of the mismatch. via="compile"
    runs the program through torch.compile(backend="keraunos") instead of keraunos.jit."""
    from .testing import compare, compare_grad

    if prog.grad:
        return compare_grad(
            _compile(prog.source()),
            _make_args(prog.setup, prog.device, True),
            fusion_type=fusion_type,
            seed=seed,
            info=info,
        )
    return compare(
        _compile(prog.source()),
        _make_args(prog.setup, prog.device),
        fusion_type=fusion_type,
        seed=seed,
        via=via,
        info=info,
    )


def shrink(prog: Program, seed: int, fusion_type: str, via: str = "jit") -> Program:
    """Removes lines (and returns) while the program still runs eagerly and still fails."""

    def fails(lines, returns):
        src = prog.source(lines, returns)
        try:
            f = _compile(src)
            from .testing import clone_args

            f(*clone_args(_make_args(prog.setup, prog.device, prog.grad)))
        except Exception:
            return False  # no longer a valid program
        from .testing import REFUSED, compare, compare_grad

        if prog.grad:
            r = compare_grad(
                f, _make_args(prog.setup, prog.device, True), fusion_type=fusion_type, seed=seed
            )
        else:
            r = compare(
                f, _make_args(prog.setup, prog.device), fusion_type=fusion_type, seed=seed, via=via
            )
        return r is not None and r != REFUSED

    lines, returns = list(prog.lines), list(prog.returns)
    changed = True
    while changed:
        changed = False
        for i in range(len(lines)):
            cand = lines[:i] + lines[i + 1 :]
            if fails(cand, returns):
                lines, changed = cand, True
                break
        for i in range(len(returns)):
            if len(returns) > 1:
                cand = returns[:i] + returns[i + 1 :]
                if fails(lines, cand):
                    returns, changed = cand, True
                    break
    out = Program(prog.rng, len(prog.params), prog.setup)
    out.device = prog.device
    out.grad = prog.grad
    out.lines, out.returns = lines, returns
    return out


def reproducer(prog: Program, seed: int, fusion_type: str, problem: str, via: str = "jit") -> str:
    setup = "\n".join(prog.setup)
    if prog.grad:
        return f"""# keraunos fuzzer reproducer (seed {seed}, fusion_type={fusion_type!r}, with gradients)
# {problem.splitlines()[0] if problem else ""}
import torch
import keraunos
from keraunos.testing import compare_grad

{prog.source()}
torch.manual_seed({seed})
dev = {prog.device!r}
{setup}
args = tuple(a.detach().requires_grad_() for a in args)
print(compare_grad(f, args, fusion_type={fusion_type!r}, seed={seed}) or "agrees with eager")
"""
    return f"""# keraunos fuzzer reproducer (seed {seed}, fusion_type={fusion_type!r}, via={via!r})
# {problem.splitlines()[0] if problem else ""}
import torch
import keraunos
from keraunos.testing import compare

{prog.source()}
torch.manual_seed({seed})
dev = {prog.device!r}
{setup}
print(compare(f, args, fusion_type={fusion_type!r}, seed={seed}, via={via!r}) or "agrees with eager")
"""


def fuzz(
    programs: int,
    seed: int,
    fusion_type: str,
    max_lines: int = 10,
    verbose=False,
    stats: dict | None = None,
    device: str = "cpu",
    via: str = "jit",
    deadline: float | None = None,
    grad: bool = False,
) -> list[str]:
    """Runs `programs` programs, or fewer when time.monotonic() passes `deadline`; returns a
    reproducer per mismatch. `stats` gets the counts of programs run and refused (see
    keraunos.testing.REFUSED). via="compile" runs them through
    torch.compile(backend="keraunos"); `stats["fell_back"]` then counts the programs in which
    some region ran eagerly (unsupported or refused by keraunos: eager semantics)."""
    from .testing import REFUSED

    failures = []
    refused = 0
    fell_back = 0
    compiled = 0
    ran = 0
    for i in range(programs):
        if deadline is not None and time.monotonic() > deadline:
            break
        ran += 1
        s = seed + i
        prog = generate(s, max_lines, device, grad)
        info: dict = {}
        problem = run_one(prog, s, fusion_type, via, info)
        if info.get("eager_regions") or info.get("eager_graphs"):
            fell_back += 1
        compiled += bool(info.get("compiled"))
        if problem == REFUSED:
            refused += 1
            continue
        if problem is not None:
            small = shrink(prog, s, fusion_type, via)
            failures.append(reproducer(small, s, fusion_type, problem, via))
            if verbose:
                print(failures[-1])
                print(problem)
    if stats is not None:
        stats.update(
            programs=ran,
            refused=refused,
            mismatches=len(failures),
            fell_back=fell_back,
            compiled_grad=compiled,
        )
    return failures


def main(argv=None):
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--programs", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fusion-type", default="both", choices=["consecutive", "dataflow", "both"])
    ap.add_argument("--max-lines", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--via",
        default="jit",
        choices=["jit", "compile"],
        help="keraunos.jit, or torch.compile(backend='keraunos')",
    )
    ap.add_argument(
        "--seconds",
        type=float,
        help="stop each fusion type after its share of this many seconds and report the "
        "programs run (seeds seed .. seed + programs run - 1)",
    )
    ap.add_argument(
        "--grad",
        action="store_true",
        help="inputs require grad: compare the backward too (gradients of every input)",
    )
    args = ap.parse_args(argv)
    kinds = ["consecutive", "dataflow"] if args.fusion_type == "both" else [args.fusion_type]
    total_fail = 0
    start = time.monotonic()
    for k, ft in enumerate(kinds):
        t0 = time.perf_counter()
        stats: dict = {}
        deadline = None
        if args.seconds is not None:
            deadline = start + args.seconds * (k + 1) / len(kinds)
        fails = fuzz(
            args.programs,
            args.seed,
            ft,
            args.max_lines,
            verbose=True,
            stats=stats,
            device=args.device,
            via=args.via,
            deadline=deadline,
            grad=args.grad,
        )
        total_fail += len(fails)
        print(
            f"fusion_type={ft}: {stats['programs']} programs (seeds {args.seed}.."
            f"{args.seed + stats['programs'] - 1}), {len(fails)} mismatches, "
            f"{stats['refused']} refused as order-dependent, {stats['fell_back']} with regions "
            f"run eagerly"
            + (
                f", {stats['compiled_grad']} through compiled backward programs"
                if args.grad
                else ""
            )
            + f" ({time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
    return 1 if total_fail else 0


if __name__ == "__main__":
    sys.exit(main())
