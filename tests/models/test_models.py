"""Model suite: tiny random-init Hugging Face models and torchvision models against eager, on
the CPU in float32, through keraunos.jit and torch.compile(backend="keraunos"), with both
fusion types, in eval (forward) and train (forward + backward: loss, outputs, every
parameter's .grad) mode. What a case does: model_cases.py.

keraunos.jit cases run in this process. torch.compile cases run in a worker process
(_worker.py: each case in a child forked from it), so that a crash fails its case instead of
ending the session.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import model_cases
from model_cases import MODELS

ENTRIES = ("jit", "compile")
FUSION_TYPES = ("consecutive", "dataflow")
MODES = ("eval", "train")
_HERE = os.path.dirname(os.path.abspath(__file__))
_WORKER_TIMEOUT_S = 1800  # all the compile cases

# The models whose attention masks transformers builds with torch.vmap also run a second
# time with masks="broadcast" (model_cases.broadcast_masks: the same masks built by
# broadcasting, in eager and keraunos alike), which tests the rest of the model while the
# vmap cases fail. Test ids: <model>-<entry>-<fusion type>-<mode>[-bcastmask].

# Known failures: (model, entry, mode, masks) -> reason, for both fusion types. Each is
# xfail(strict=True): when one starts passing, the suite says so.
# (Whisper's LayerDrop branch, `torch.rand([]) < layerdrop` in train mode, splits the program
# under keraunos.jit: python/keraunos/split.py.)
KNOWN_FAILURES: dict[tuple[str, str, str, str], str] = {}

_PARAMS = ("name", "entry", "fusion_type", "mode", "masks")


def _cases():
    for name in MODELS:
        # The vmap-built masks run now (keraunos.jit runs torch.vmap through torch, the
        # dispatcher refuses BatchedTensors): the broadcast-mask variants (masks="broadcast")
        # are kept in model_cases for debugging, not run.
        for masks in ("vmap",):
            for entry in ENTRIES:
                for fusion_type in FUSION_TYPES:
                    for mode in MODES:
                        reason = KNOWN_FAILURES.get((name, entry, mode, masks))
                        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                        suffix = "-bcastmask" if masks == "broadcast" else ""
                        yield pytest.param(
                            name,
                            entry,
                            fusion_type,
                            mode,
                            masks,
                            marks=marks,
                            id=f"{name}-{entry}-{fusion_type}-{mode}{suffix}",
                        )


class _CompileRunner:
    """Runs the selected torch.compile cases in one worker process (each case in a child
    forked from it), the first time one of them is asked for."""

    def __init__(self):
        self.results: dict[str, dict] = {}

    def result(self, case: str, session) -> dict:
        if case not in self.results:
            selected = [
                ":".join(item.callspec.params[k] for k in _PARAMS)
                for item in session.items
                if getattr(item, "originalname", None) == "test_model"
                and item.callspec.params["entry"] == "compile"
            ]
            self._run([c for c in selected if c not in self.results] or [case])
        return self.results[case]

    def _run(self, cases: list[str]) -> None:
        worker = os.path.join(_HERE, "_worker.py")
        try:
            proc = subprocess.run(
                [sys.executable, worker, *cases],
                capture_output=True,
                text=True,
                timeout=_WORKER_TIMEOUT_S,
            )
            stdout, stderr, how = proc.stdout, proc.stderr, f"exit status {proc.returncode}"
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode() if isinstance(e.stdout, bytes) else e.stdout or ""
            stderr = e.stderr.decode() if isinstance(e.stderr, bytes) else e.stderr or ""
            how = f"timeout after {_WORKER_TIMEOUT_S} s"
        for line in stdout.splitlines():
            if line.startswith("RESULT "):
                _, case, payload = line.split(" ", 2)
                self.results[case] = json.loads(payload)
        for case in cases:  # the worker itself failed before reaching these
            self.results.setdefault(
                case, {"ok": False, "error": f"the worker ended ({how}):\n{stderr[-4000:]}"}
            )


_RUNNER = _CompileRunner()


@pytest.mark.parametrize(",".join(_PARAMS), list(_cases()))
def test_model(name, entry, fusion_type, mode, masks, request):
    pytest.importorskip(MODELS[name][1])
    if entry == "jit":
        model_cases.run_case(name, entry, fusion_type, mode, masks=masks)
        return
    r = _RUNNER.result(f"{name}:{entry}:{fusion_type}:{mode}:{masks}", request.session)
    if not r["ok"]:
        pytest.fail(r["error"], pytrace=False)


def test_jit_returns_cache_object():
    # With use_cache=True, T5's output holds past_key_values (an EncoderDecoderCache): rebuilt
    # around the program's tensors on every call.
    pytest.importorskip("transformers")
    model_cases.run_case("t5", "jit", "consecutive", "eval", use_cache=True)
