import os

os.environ.setdefault("KERAUNOS_VERIFY", "1")  # the verifier runs after every pass in tests
