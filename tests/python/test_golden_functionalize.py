"""Golden traces: the functionalized trace of each pattern, printed and checked exactly (names
canonicalized, comments dropped), plus the pattern's agreement with eager.

Regenerate after an intended change with KERAUNOS_UPDATE_GOLDEN=1 and review the diff."""

import os
from pathlib import Path

import pytest
import torch

import keraunos
from harness import canonical, check

GOLDEN = Path(__file__).parent / "golden" / "functionalize"
UPDATE = os.environ.get("KERAUNOS_UPDATE_GOLDEN") == "1"


def inplace_on_input(x):
    x.sin_()


def inplace_through_view(x):
    x.view(-1).sin_()


def dead_intermediate_mutation():
    torch.randn(4).sin_()


def mutate_then_read(x):
    x.mul_(2)
    return x + 1


def read_then_mutate(x):
    y = x + 1
    x.mul_(2)
    return y


def view_of_mutated_input_returned(x):
    x.add_(1)
    return x.view(-1)


def write_slice_read_base(x):
    x[0] = 1.0
    return x.sum()


def write_base_read_slice(x):
    v = x[1]
    x.mul_(3)
    return v.exp()


def two_views_one_write(x):
    a = x[:, 0]
    b = x[:, 1]
    a.copy_(b)
    return a, b


def aliased_inputs_same_tensor(a, b):
    a.add_(1)
    return b * 2


def overlapping_input_views(a, b):
    a.mul_(2)
    return b.clone()


def mutate_intermediate_view(x):
    y = x * 2
    y[1:].zero_()
    return y


def intermediate_view_returned(x):
    y = x + 1
    v = y.t()
    v.add_(1)
    return v, y


def transpose_write(x):
    x.t().add_(torch.ones(3, 2))


def diagonal_write(x):
    x.diagonal().fill_(0.0)


def setitem_tensor_index(x):
    x[torch.tensor([0, 2])] = 5.0
    return x


def masked_fill_inplace(x):
    x.masked_fill_(x > 0, 0.0)


def unsqueeze_write(x):
    x.unsqueeze(0).mul_(2)
    return x


def chunk_write(x):
    a, b = x.chunk(2)
    a.add_(b)
    return x


def copy_into_input(x, y):
    x.copy_(y.t())


def out_argument(x, y):
    torch.add(x, 1, out=y)
    return y


def noop_to_write(x):
    x.to(torch.float32).add_(1)


def several_writes_one_storage(x):
    x[0].add_(1)
    x[1].mul_(2)
    x.add_(x[2] * 1)
    return x[0] + x[1]


PATTERNS = {
    "inplace_on_input": (inplace_on_input, lambda: (torch.randn(2, 3),)),
    "inplace_through_view": (inplace_through_view, lambda: (torch.randn(2, 3),)),
    "dead_intermediate_mutation": (dead_intermediate_mutation, lambda: ()),
    "mutate_then_read": (mutate_then_read, lambda: (torch.randn(3),)),
    "read_then_mutate": (read_then_mutate, lambda: (torch.randn(3),)),
    "view_of_mutated_input_returned": (
        view_of_mutated_input_returned,
        lambda: (torch.randn(2, 3),),
    ),
    "write_slice_read_base": (write_slice_read_base, lambda: (torch.randn(3, 2),)),
    "write_base_read_slice": (write_base_read_slice, lambda: (torch.randn(3, 2),)),
    "two_views_one_write": (two_views_one_write, lambda: (torch.randn(3, 2),)),
    "aliased_inputs_same_tensor": (
        aliased_inputs_same_tensor,
        lambda: (lambda t: (t, t))(torch.randn(3)),
    ),
    "overlapping_input_views": (
        overlapping_input_views,
        lambda: (lambda t: (t[:3], t[1:]))(torch.randn(4)),
    ),
    "mutate_intermediate_view": (mutate_intermediate_view, lambda: (torch.randn(3),)),
    "intermediate_view_returned": (intermediate_view_returned, lambda: (torch.randn(2, 3),)),
    "transpose_write": (transpose_write, lambda: (torch.randn(2, 3),)),
    "diagonal_write": (diagonal_write, lambda: (torch.randn(3, 3),)),
    "setitem_tensor_index": (setitem_tensor_index, lambda: (torch.randn(4),)),
    "masked_fill_inplace": (masked_fill_inplace, lambda: (torch.randn(4),)),
    "unsqueeze_write": (unsqueeze_write, lambda: (torch.randn(3),)),
    "chunk_write": (chunk_write, lambda: (torch.randn(4),)),
    "copy_into_input": (copy_into_input, lambda: (torch.randn(2, 3), torch.randn(3, 2))),
    "out_argument": (out_argument, lambda: (torch.randn(3), torch.randn(3))),
    "noop_to_write": (noop_to_write, lambda: (torch.randn(3),)),
    "several_writes_one_storage": (several_writes_one_storage, lambda: (torch.randn(3, 2),)),
}


@pytest.mark.parametrize("name", sorted(PATTERNS))
@pytest.mark.parametrize("fusion_type", ["consecutive", "dataflow"])
def test_golden(name, fusion_type):
    fn, make = PATTERNS[name]
    torch.manual_seed(0)
    jf = check(fn, *make(), fusion_type=fusion_type, seed=0)
    traces = keraunos.last_traces(jf)
    functional = next(t for t in traces if t.stage == "functionalize")
    text = canonical(functional)
    for t in traces:  # every stage ends with return; no in-place symbol after functionalize
        body = [ln for ln in str(t).splitlines() if ln.strip() and not ln.strip().startswith("#")]
        assert body[-1].strip().startswith("return"), t
    path = GOLDEN / f"{name}.txt"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"no golden file for {name}: run with KERAUNOS_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def test_dead_mutation_leaves_no_trace():
    jf = keraunos.jit(dead_intermediate_mutation, fusion_type="dataflow")
    assert jf() is None
    final = str(keraunos.last_traces(jf)[-2])
    assert "sin" not in final and "copy_" not in final
    assert "randn" in final  # the draw stays: it advances the generator, as in eager


def test_partial_overlap_is_an_error_like_eager():
    def f(x):
        x.add_(x[2])

    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        f(torch.randn(3, 2))
    with pytest.raises(RuntimeError, match="refer to a single memory location"):
        keraunos.jit(f)(torch.randn(3, 2))
