"""Every knob of keraunos, from the C++ options registry (csrc/keraunos/support/options.cpp):
environment variables, keraunos.jit's options and the CUDA tuning keys.

    >>> print(keraunos.options())            # the table: name, variable, value, meaning
    >>> keraunos.options()["fusion"]["value"]
    True
    >>> keraunos.set_option("fusion", False)  # this process; None goes back to the variable
"""

from __future__ import annotations

import textwrap

from . import _C


class OptionTable(dict):
    """name -> {"env", "kind", "default", "value", "set", "jit_arg", "doc", "keys"}; prints as
    a table."""

    def __str__(self) -> str:
        lines = []
        for name, o in self.items():
            where = o["env"] or "-"
            if o["jit_arg"]:
                where += f" / jit({o['jit_arg']}=)"
            lines.append(f"{name} = {o['value']!r}    [{where}; default {o['default']!r}]")
            lines.extend(
                textwrap.wrap(o["doc"], 92, initial_indent="    ", subsequent_indent="    ")
            )
            for key, lo, hi, pow2, zero_ok, switch, doc in o["keys"]:
                rng = "0/1" if switch else f"{'2^k in ' if pow2 else ''}{lo}..{hi}"
                rng += " or 0" if zero_ok else ""
                lines.append(f"      {key} ({rng}): {doc}")
        return "\n".join(lines)


def options() -> OptionTable:
    """Every option with its current value (set_option's, else its environment variable's,
    else the default), where it comes from and what it does."""
    table = OptionTable()
    for o in _C.option_table():
        name = o.pop("name")
        o["value"] = _C.option(name)
        table[name] = o
    return table


def set_option(name: str, value) -> None:
    """Sets an option for this process: a bool for on/off options, text otherwise (a tuning
    option takes "key=value,..."); None clears it (its environment variable or default again).
    Options read once per process (see their doc) take it only before that first read."""
    if isinstance(value, bool):
        value = "1" if value else "0"
    _C.set_option(name, None if value is None else str(value))
