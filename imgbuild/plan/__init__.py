"""The Plan: decide (CUDA, base, patches, smoke model) from a target, its lock and the
options; render the Dockerfile from it; hash what decides the image's bytes into the content
key. Pure: no Docker, and no network except what the resolver needs."""
