"""Helpers the torch executor's generated programs call for indexing ops (the program prints
an index as a list; Python indexing needs a tuple)."""


def getitem(a, idx):
    return a[tuple(idx)]


def setitem(a, idx, v):
    a[tuple(idx)] = v
