"""creation ops: see torch_map/__init__.py."""
