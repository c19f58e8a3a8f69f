"""What the two OpInfo sweep tests share: loading a sweep script from scripts/ and checking its
result against a strict list of known failures."""

import importlib.util
import pathlib

import pytest

_SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / "scripts"


def load_script(name: str):
    """scripts/<name>.py as a module (the sweeps live there to run from the command line)."""
    spec = importlib.util.spec_from_file_location(name, _SCRIPTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_known_failures(result: dict, xfail: dict[str, str], what: str) -> None:
    """Fails on an op whose status is wrong or internal and that `xfail` does not list, and on
    an op `xfail` lists that passes now (strict: the list shrinks as ops are fixed)."""
    failing = {
        name: o["first"]
        for name, o in result["ops"].items()
        if o["status"] in ("internal", "wrong")
    }
    new = {k: v for k, v in failing.items() if k not in xfail}
    fixed = sorted(k for k in xfail if k in result["ops"] and k not in failing)
    msg = []
    if new:
        msg.append(
            f"new {what} or internal errors:\n"
            + "\n".join(f"  {k}: {v}" for k, v in sorted(new.items()))
        )
    if fixed:
        msg.append(f"listed in XFAIL but passing now (remove them): {fixed}")
    if msg:
        pytest.fail("\n".join(msg))
