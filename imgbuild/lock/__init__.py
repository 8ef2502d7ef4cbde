"""Locking: resolve each target with uv for the image's platform, write hash-pinned lockfiles,
explain conflicts, keep the overrides that carry reasons, read locked wheels without
installing them."""
