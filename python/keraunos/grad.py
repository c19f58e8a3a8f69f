"""Programs that autograd records: a compiled forward and backward pair run as one
torch.autograd.Function (the pair comes from the C++ autodiff pass, passes/autodiff.cpp).

The forward program returns the outputs and the tensors the backward reads; they are kept
with ctx.save_for_backward, so autograd frees them when the backward has run (unless
retain_graph) and checks them for in-place changes between the two, as it does for its own
saved tensors. Outputs that eager would not make require grad (integer results, detached
values) are marked non-differentiable. Outputs that are views of inputs are made here, outside
the Function, with torch.as_strided on that input: autograd records them as eager does, as
views. The backward program takes its inputs as one list (boxed) and frees each saved tensor after
its last use, as every other temporary. The backward is not itself differentiable: a double backward (create_graph=True)
raises NotImplementedError by name.
"""

from __future__ import annotations

import torch


class GradProgram:
    """Calls like the program it replaces (program inputs in, the trace's return out)."""

    __slots__ = ("forward", "backward", "leaves", "differentiable", "single")

    def __init__(self, forward, backward, leaves, single):
        self.forward = forward
        self.backward = backward
        self.leaves = tuple(leaves)  # per return leaf: ("value",), ("tensor", d), ("alias", ...)
        self.differentiable = tuple(info[1] for info in self.leaves if info[0] == "tensor")
        self.single = single

    def __call__(self, *inputs):
        box = []
        tensors = _Function.apply(self, box, *inputs)
        it = iter(tensors)
        out = []
        for leaf, info in zip(box[0], self.leaves):
            if info[0] == "tensor":
                out.append(next(it))
            elif info[0] == "alias":
                _, i, identity, detached, size, stride, offset = info
                base = inputs[i].detach() if detached else inputs[i]
                out.append(base if identity else torch.as_strided(base, size, stride, offset))
            else:
                out.append(leaf)
        return out[0] if self.single else out


class _Function(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gp, box, *inputs):
        out, saved = gp.forward(*inputs)
        leaves = [out] if gp.single else list(out)
        box.append(leaves)
        tensors = tuple(x for x, info in zip(leaves, gp.leaves) if info[0] == "tensor")
        ctx.gp = gp
        ctx.save_for_backward(*saved)
        fixed = [t for t, d in zip(tensors, gp.differentiable) if not d]
        if fixed:
            ctx.mark_non_differentiable(*fixed)
        return tensors

    @staticmethod
    def backward(ctx, *grads):
        gp = ctx.gp
        if torch.is_grad_enabled():
            raise NotImplementedError(
                "keraunos: a double backward (create_graph=True) through a program compiled by "
                "keraunos.jit is not supported yet; call the function without keraunos.jit to "
                "take higher-order gradients"
            )
        # The backward program was generated for contiguous gradients of the differentiable
        # outputs (autograd may hand an expanded or strided one).
        args = [*ctx.saved_tensors]
        args += [g.contiguous() for g, d in zip(grads, gp.differentiable) if d]
        # The backward program takes its inputs boxed and frees each saved tensor at its last
        # use; autograd lets go of its own references now (unless retain_graph keeps them).
        ctx.maybe_clear_saved_tensors()
        res = gp.backward(args)
        return (None, None, *res)
