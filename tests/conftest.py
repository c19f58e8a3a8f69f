import importlib
import os

os.environ.setdefault("KERAUNOS_VERIFY", "1")  # the verifier runs after every pass in tests

# Collect the ops that acquired traces contain, for tests/python/test_zz_op_coverage.py.
importlib.import_module("keraunos.jit").OP_COVERAGE = set()
