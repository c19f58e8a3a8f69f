"""Runs model cases, each in a forked child process: a crash (segfault) of one case is
reported as that case's failure and the others still run. tests/models/test_models.py runs
the torch.compile cases through it.

    python _worker.py MODEL:ENTRY:FUSION_TYPE:MODE:MASKS ...

Imports torch, transformers, torchvision and keraunos once (running no torch op, so that the
children start with no thread pools), then forks a child per case. Prints one line per case,
`RESULT <case> <json>`, the JSON being {"ok": bool, "error": str}.
"""

import faulthandler
import json
import os
import signal
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import model_cases  # noqa: E402

CASE_TIMEOUT_S = 300


def _preload():
    import importlib
    import importlib.util

    import keraunos  # noqa: F401

    for mod in ("transformers", "torchvision.models"):
        if importlib.util.find_spec(mod.split(".")[0]) is not None:
            importlib.import_module(mod)


def _child(case: str, result_path: str, stderr_path: str) -> None:
    fd = os.open(stderr_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 2)
    faulthandler.enable()  # a crash prints the Python stack to the case's stderr
    signal.alarm(CASE_TIMEOUT_S)
    name, entry, fusion_type, mode, masks = case.split(":")
    try:
        model_cases.run_case(name, entry, fusion_type, mode, masks=masks)
        result = {"ok": True, "error": ""}
    except Exception as e:
        tb = traceback.format_exc(limit=-12)
        result = {"ok": False, "error": f"{type(e).__name__}: {e}\n{tb}"}
    with open(result_path, "w") as f:
        json.dump(result, f)


def main(cases):
    _preload()
    with tempfile.TemporaryDirectory(prefix="keraunos-models-") as tmp:
        for i, case in enumerate(cases):
            result_path = os.path.join(tmp, f"{i}.json")
            stderr_path = os.path.join(tmp, f"{i}.err")
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    _child(case, result_path, stderr_path)
                except BaseException:
                    code = 1
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            if os.path.exists(result_path):
                with open(result_path) as f:
                    result = json.load(f)
            else:
                if os.WIFSIGNALED(status):
                    how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
                else:
                    how = f"exit status {os.WEXITSTATUS(status)}"
                err = ""
                if os.path.exists(stderr_path):
                    with open(stderr_path, errors="replace") as f:
                        err = f.read()[-6000:]
                result = {
                    "ok": False,
                    "error": f"the case's process crashed ({how}); its stderr ends:\n{err}",
                }
            print(f"RESULT {case} {json.dumps(result)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
